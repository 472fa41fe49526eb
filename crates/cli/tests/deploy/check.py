"""Renders deploy/'s Kustomize entry points the way `kubectl kustomize` does for what they use
(resources, directories of their own, `namespace`, `labels`, strategic-merge patches of
containers and env by name) and checks what the manifests promise each other: every file
listed exists and every manifest is listed, every patch lands on a container and variable
that exist, Services and the PodDisruptionBudget select the nodes' pods, the StatefulSet names
its headless Service and probes /healthz, every Secret the pods read is made by the overlay
(or by the CloudNativePG Cluster it declares), and the Cluster is a usable PostgreSQL 15.

usage: check.py DEPLOY_DIR OUT_DIR
Writes each entry point's rendering to OUT_DIR/<entry>/NN-<kind>-<name>.yaml (for
kubernetes-validate) and prints `<entry> <kind> <namespace> <name>` per resource.
"""

import copy
import os
import sys

import yaml

ENTRIES = {
    "default": ".",
    "cloudnative-pg": "overlays/cloudnative-pg",
    "external-postgres": "overlays/external-postgres",
}


def fail(msg):
    sys.exit(f"deploy check failed: {msg}")


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def merge(base, patch):
    """A strategic merge for what the overlays patch: maps recursively, lists of named maps by
    name (containers, env), anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(x, dict) and "name" in x for x in base + patch)
    ):
        out = [dict(x) for x in base]
        for p in patch:
            i = next((i for i, x in enumerate(out) if x["name"] == p["name"]), None)
            if i is None:
                out.append(p)
            else:
                out[i] = merge(out[i], p)
        return out
    return patch


def check_patch_lands(base, patch, where):
    """Every named item the patch touches exists in the target: a typo'd container or
    variable would add a new one instead of changing the old."""
    if isinstance(base, dict) and isinstance(patch, dict):
        for k, v in patch.items():
            if k not in base:
                fail(f"{where}: patches {k!r}, which the target does not have")
            check_patch_lands(base[k], v, f"{where}.{k}")
    elif isinstance(base, list) and isinstance(patch, list):
        for p in patch:
            if isinstance(p, dict) and "name" in p:
                match = [x for x in base if isinstance(x, dict) and x.get("name") == p["name"]]
                if not match:
                    fail(f"{where}: patches {p['name']!r}, which the target does not have")
                check_patch_lands(match[0], {k: v for k, v in p.items() if k != "valueFrom"},
                                  f"{where}[{p['name']}]")


def render(directory, seen):
    kfile = os.path.join(directory, "kustomization.yaml")
    if not os.path.exists(kfile):
        fail(f"{directory} has no kustomization.yaml")
    seen.add(os.path.realpath(kfile))
    (k,) = load_all(kfile)
    if k.get("apiVersion") != "kustomize.config.k8s.io/v1beta1" or k.get("kind") != "Kustomization":
        fail(f"{kfile}: not a Kustomization")
    known = {"apiVersion", "kind", "resources", "namespace", "labels", "patches"}
    if set(k) - known:
        fail(f"{kfile}: fields this check does not render: {sorted(set(k) - known)}")
    docs = []
    for r in k.get("resources", []):
        path = os.path.join(directory, r)
        if os.path.isdir(path):
            docs += render(path, seen)
        elif os.path.isfile(path):
            seen.add(os.path.realpath(path))
            docs += load_all(path)
        else:
            fail(f"{kfile}: resource {r} does not exist")
    for p in k.get("patches", []):
        path = os.path.join(directory, p["path"])
        if not os.path.isfile(path):
            fail(f"{kfile}: patch {p['path']} does not exist")
        seen.add(os.path.realpath(path))
        (patch,) = load_all(path)
        target = p.get("target", {})
        hits = [d for d in docs if d["kind"] == target.get("kind")
                and d["metadata"]["name"] == target.get("name")]
        if len(hits) != 1 or patch["kind"] != target["kind"] or patch["metadata"]["name"] != target["name"]:
            fail(f"{kfile}: patch {p['path']} does not match exactly one resource")
        body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind", "metadata")}
        check_patch_lands(hits[0], body, p["path"])
        i = docs.index(hits[0])
        docs[i] = merge(hits[0], body)
    if "namespace" in k:
        for d in docs:
            if d["kind"] != "Namespace":
                d.setdefault("metadata", {})["namespace"] = k["namespace"]
    for group in k.get("labels", []):
        for d in docs:
            d.setdefault("metadata", {}).setdefault("labels", {}).update(group["pairs"])
    return [copy.deepcopy(d) for d in docs]


def pod_of(d):
    return d["spec"]["template"]


def check_entry(name, docs):
    by = {}
    for d in docs:
        key = (d["kind"], d["metadata"]["name"])
        if key in by:
            fail(f"{name}: {key} twice")
        by[key] = d
    ns = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    if ns != {"runcell"} or ("Namespace", "runcell") not in by:
        fail(f"{name}: everything goes in the namespace runcell, which it makes (found {ns})")
    sts = by.get(("StatefulSet", "runcell")) or fail(f"{name}: no StatefulSet runcell")
    labels = pod_of(sts)["metadata"]["labels"]
    if sts["spec"]["selector"]["matchLabels"].items() > labels.items():
        fail(f"{name}: the StatefulSet's selector misses its pods")
    headless = by.get(("Service", sts["spec"]["serviceName"])) or fail(
        f"{name}: the StatefulSet's serviceName is no Service")
    if headless["spec"].get("clusterIP") != "None":
        fail(f"{name}: the nodes' Service is not headless")
    for svc in [d for d in docs if d["kind"] == "Service"]:
        if svc["spec"]["selector"].items() > labels.items():
            fail(f"{name}: Service {svc['metadata']['name']} selects no node")
    pdb = by.get(("PodDisruptionBudget", "runcell")) or fail(f"{name}: no PodDisruptionBudget")
    if pdb["spec"]["selector"]["matchLabels"].items() > labels.items():
        fail(f"{name}: the PodDisruptionBudget selects no node")
    (node,) = [c for c in pod_of(sts)["spec"]["containers"] if c["name"] == "runcell"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if node.get(probe, {}).get("httpGet", {}).get("path") != "/healthz":
            fail(f"{name}: {probe} is not on /healthz")
    ports = {p["name"] for p in node["ports"]}
    for svc in [d for d in docs if d["kind"] == "Service"]:
        for p in svc["spec"]["ports"]:
            if p["targetPort"] not in ports:
                fail(f"{name}: Service {svc['metadata']['name']} targets no port of the node")
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    mounts = {m["name"]: m["mountPath"] for m in node["volumeMounts"]}
    if mounts.get("data") != "/var/lib/runcell" or "data" not in claims:
        fail(f"{name}: the data dir is not each node's own volume")
    env = {e["name"]: e for e in node["env"]}
    if env.get("RUNCELL_DATA_DIR", {}).get("value") != "/var/lib/runcell":
        fail(f"{name}: RUNCELL_DATA_DIR is not the volume")
    if sts["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30) < 60:
        fail(f"{name}: too short a grace period to end or pause sessions")
    # Every Secret a pod reads exists: made here, or by the CloudNativePG Cluster (<name>-app).
    made = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    made |= {d["metadata"]["name"] + "-app" for d in docs
             if d["kind"] == "Cluster" and d["apiVersion"] == "postgresql.cnpg.io/v1"}
    # Made by the operator by hand, before the first apply (docs/scale.md).
    by_hand = {"runcell-audit-keys"}
    for d in docs:
        if d["kind"] not in ("StatefulSet", "Job"):
            continue
        spec = pod_of(d)["spec"]
        refs = [v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v]
        for c in spec.get("initContainers", []) + spec["containers"]:
            refs += [e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                     if "secretKeyRef" in e.get("valueFrom", {})]
        for r in refs:
            if r not in made | by_hand:
                fail(f"{name}: {d['kind']} {d['metadata']['name']} reads Secret {r}, which "
                     "nothing makes")
        dburl = [e for c in spec["containers"] for e in c.get("env", [])
                 if e["name"] == "RUNCELL_DATABASE_URL"]
        if len(dburl) != 1:
            fail(f"{name}: {d['metadata']['name']} has no single RUNCELL_DATABASE_URL")
    for d in docs:
        if d["kind"] == "Cluster":
            spec = d["spec"]
            if not (isinstance(spec.get("instances"), int) and spec["instances"] >= 1):
                fail(f"{name}: the Cluster has no instances")
            if not spec.get("imageName", "").endswith(":15"):
                fail(f"{name}: the Cluster is not PostgreSQL 15")
            if not spec.get("storage", {}).get("size"):
                fail(f"{name}: the Cluster has no storage")
            unknown = set(spec) - {"instances", "imageName", "bootstrap", "storage", "resources"}
            if unknown:
                fail(f"{name}: Cluster fields this check does not know: {sorted(unknown)}")


def main():
    deploy, out = sys.argv[1], sys.argv[2]
    seen = set()
    for name, rel in ENTRIES.items():
        docs = render(os.path.join(deploy, rel), seen)
        check_entry(name, docs)
        os.makedirs(os.path.join(out, name), exist_ok=True)
        for i, d in enumerate(docs):
            fname = f"{i:02}-{d['kind'].lower()}-{d['metadata']['name']}.yaml"
            with open(os.path.join(out, name, fname), "w") as f:
                yaml.safe_dump(d, f, sort_keys=False)
            print(name, d["kind"], d["metadata"].get("namespace", "-"), d["metadata"]["name"])
    listed = set()
    for root, _, files in os.walk(deploy):
        listed |= {os.path.realpath(os.path.join(root, f)) for f in files
                   if f.endswith((".yaml", ".yml"))}
    if listed - seen:
        fail(f"manifests no kustomization lists: {sorted(listed - seen)}")


main()
