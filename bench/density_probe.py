#!/usr/bin/env python3
"""Where a live session's memory goes (issue 23, item 5): the breakdown behind bench/density.py's
one number.

On a running server, K sessions are created one after the other, each runs bench/density.py's
cell (a pandas frame and a matplotlib figure saved to PNG) and stays alive. Then:

  - /proc/meminfo before and after, the difference / K for the fields that make up
    MemAvailable's drop (anonymous pages, shmem = tmpfs workspaces, page tables, slab, kernel
    stacks, per-cpu);
  - /proc/slabinfo before and after: the slab caches that grew most, in KiB per session (the
    network namespace's, the mount's, the cgroup's objects);
  - per session, its memory cgroup (v1 memory.stat: rss, rss_huge, cache, shmem, mapped_file;
    kmem usage) and each of its processes (the sandbox's pid 1 and the kernel):
    /proc/PID/smaps_rollup (Rss, Pss, Private_Dirty, Anonymous, AnonHugePages) and VmPTE, plus
    the kernel's private dirty pages by kind of mapping ([heap], other anonymous, file-backed
    .so data, stacks);
  - the medians over the K sessions, printed as a markdown table and written as JSON.

  python3 bench/density_probe.py BASE_URL K OUT_JSON      (stdlib only; as root)
"""

import glob
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from density import CELL, sandbox_cgroup_bytes  # noqa: E402
from sessions import Client  # noqa: E402

MEMINFO_FIELDS = (
    "MemAvailable", "MemFree", "AnonPages", "AnonHugePages", "Shmem", "Cached", "PageTables",
    "Slab", "SReclaimable", "SUnreclaim", "KernelStack", "Percpu", "VmallocUsed",
)


def meminfo():
    out = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0])
    return out


def slabinfo():
    """KiB held by each slab cache (active objects × object size)."""
    out = {}
    try:
        lines = open("/proc/slabinfo").read().splitlines()[2:]
    except OSError:
        return out
    for line in lines:
        f = line.split()
        out[f[0]] = int(f[1]) * int(f[3]) / 1024
    return out


def kib_fields(text, names):
    got = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k in names:
            got[k] = int(v.split()[0])
    return got


def smaps_by_kind(pid):
    """Private dirty KiB of a process by kind of mapping."""
    kinds = {}
    kind = None
    try:
        text = open(f"/proc/{pid}/smaps").read()
    except OSError:
        return kinds
    for line in text.splitlines():
        first = line.split(None, 1)[0]
        if "-" in first and not first.endswith(":"):
            f = line.split()
            name = f[5] if len(f) > 5 else ""
            if name == "[heap]":
                kind = "heap"
            elif name.startswith("[stack"):
                kind = "stack"
            elif name == "":
                kind = "anon"
            elif name.startswith("["):
                kind = "other"
            else:
                kind = "file"
        elif first == "Private_Dirty:":
            kinds[kind] = kinds.get(kind, 0) + int(line.split()[1])
    return kinds


def process(pid):
    status = open(f"/proc/{pid}/status").read()
    nspid = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")][0]
    rollup = kib_fields(open(f"/proc/{pid}/smaps_rollup").read(),
                        {"Rss", "Pss", "Private_Dirty", "Private_Clean", "Anonymous",
                         "AnonHugePages", "Shared_Dirty"})
    info = {"pid": pid, "ns_pid": int(nspid[-1]),
            "comm": open(f"/proc/{pid}/comm").read().strip(),
            **rollup, **kib_fields(status, {"VmPTE", "VmRSS"})}
    if info["ns_pid"] != 1:
        info["private_dirty_by_kind"] = smaps_by_kind(pid)
    return info


def cgroup(path):
    stat = {}
    for line in open(os.path.join(path, "memory.stat")):
        k, v = line.split()
        stat[k] = int(v)
    out = {"usage_kib": int(open(os.path.join(path, "memory.usage_in_bytes")).read()) // 1024}
    for k in ("rss", "rss_huge", "cache", "shmem", "mapped_file"):
        if k in stat:
            out[k + "_kib"] = stat[k] // 1024
    try:
        out["kmem_kib"] = int(open(os.path.join(path, "memory.kmem.usage_in_bytes")).read()) // 1024
    except OSError:
        pass
    pids = []
    for procs in glob.glob(os.path.join(path, "**", "cgroup.procs"), recursive=True):
        pids += [int(p) for p in open(procs).read().split()]
    out["processes"] = [process(p) for p in sorted(set(pids))]
    return out


def med(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values) / 1024, 2) if values else None


def main():
    base, k, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    c = Client(base)
    _, warm = c.create()
    c.execute(warm, CELL)
    c.delete(warm)
    time.sleep(1)
    existing = set(sandbox_cgroup_bytes())
    m0, s0 = meminfo(), slabinfo()
    ids = []
    for _ in range(k):
        _, sid = c.create()
        _, e = c.execute(sid, CELL)
        if "(True, (8, 2))" not in json.dumps(e["results"]):
            raise RuntimeError(f"unexpected result: {e['results']}")
        ids.append(sid)
    time.sleep(2)
    m1, s1 = meminfo(), slabinfo()
    groups = []
    for g in sandbox_cgroup_bytes():
        if g not in existing:
            try:
                groups.append(cgroup(g))
            except OSError:
                pass  # a sandbox that ended meanwhile
    for sid in ids:
        c.delete(sid)

    per = {f: round((m0[f] - m1[f] if f in ("MemAvailable", "MemFree") else m1[f] - m0[f])
                    / 1024 / k, 2) for f in MEMINFO_FIELDS if f in m0}
    slab = sorted(((round((s1.get(n, 0) - s0.get(n, 0)) / k, 1), n) for n in s1), reverse=True)
    kernels = [p for g in groups for p in g["processes"] if p["ns_pid"] != 1]
    pid1s = [p for g in groups for p in g["processes"] if p["ns_pid"] == 1]
    kinds = sorted({kd for p in kernels for kd in p.get("private_dirty_by_kind", {})})
    res = {
        "sessions": k,
        "meminfo_mib_per_session": per,
        "slab_kib_per_session_top": [[n, v] for v, n in slab[:15]],
        "median_mib": {
            "cgroup_usage": med([g["usage_kib"] for g in groups]),
            "cgroup_rss": med([g.get("rss_kib") for g in groups]),
            "cgroup_rss_huge": med([g.get("rss_huge_kib") for g in groups]),
            "cgroup_cache": med([g.get("cache_kib") for g in groups]),
            "cgroup_shmem": med([g.get("shmem_kib") for g in groups]),
            "cgroup_kmem": med([g.get("kmem_kib") for g in groups]),
            "kernel_private_dirty": med([p.get("Private_Dirty") for p in kernels]),
            "kernel_anonymous": med([p.get("Anonymous") for p in kernels]),
            "kernel_anon_huge": med([p.get("AnonHugePages") for p in kernels]),
            "kernel_pss": med([p.get("Pss") for p in kernels]),
            "kernel_vmpte": med([p.get("VmPTE") for p in kernels]),
            **{f"kernel_private_dirty_{kd}":
               med([p["private_dirty_by_kind"].get(kd, 0) for p in kernels]) for kd in kinds},
            "pid1_private_dirty": med([p.get("Private_Dirty") for p in pid1s]),
            "pid1_pss": med([p.get("Pss") for p in pid1s]),
            "pid1_vmpte": med([p.get("VmPTE") for p in pid1s]),
        },
        "processes_per_session": round(sum(len(g["processes"]) for g in groups) / max(1, len(groups)), 2),
        "groups": groups,
    }
    json.dump(res, open(out, "w"), indent=2)
    print(f"| measure (K={k}) | MiB per session |\n|:--|--:|")
    for f, v in per.items():
        print(f"| meminfo {f} | {v} |")
    for f, v in res["median_mib"].items():
        print(f"| median {f} | {v} |")
    print("\nslab caches that grew most, KiB per session: " +
          ", ".join(f"{n} {v}" for v, n in slab[:12]))


if __name__ == "__main__":
    main()
