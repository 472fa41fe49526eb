"""Reads an image's C2PA manifest with the C2PA SDK's Python bindings (c2pa-python, the
Content Authenticity Initiative's own) and prints one JSON report:

    python check.py IMAGE MIME [CA.pem]

{"state": "Trusted" | "Valid" | "Invalid", "generator": ..., "actions": [...],
 "runcell": {...}, "failures": [codes], "signer": {...}} or {"error": "..."}.
With CA.pem the chain must end at that certificate (the server's GET /v1/audit/c2pa-ca)
to be Trusted; without it trust is not checked.
"""
import json
import sys

import c2pa


def main():
    path, mime = sys.argv[1], sys.argv[2]
    ca = open(sys.argv[3]).read() if len(sys.argv) > 3 else None
    if ca is None:
        settings = {"verify": {"verify_trust": False}}
    else:
        settings = {"verify": {"verify_trust": True}, "trust": {"trust_anchors": ca}}
    context = c2pa.Context(c2pa.Settings.from_dict(settings))
    try:
        with open(path, "rb") as f:
            with c2pa.Reader(mime, f, context=context) as reader:
                store = json.loads(reader.json())
    except c2pa.C2paError as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return
    active = store["manifests"][store["active_manifest"]]
    assertions = {a["label"]: a["data"] for a in active.get("assertions", [])}
    actions = assertions.get("c2pa.actions.v2", assertions.get("c2pa.actions", {}))
    results = store.get("validation_results", {}).get("activeManifest", {})
    print(json.dumps({
        "state": store.get("validation_state"),
        "sdk": c2pa.sdk_version(),
        "generator": active.get("claim_generator_info"),
        "actions": actions.get("actions", []),
        "runcell": assertions.get("org.runcell.execution"),
        "failures": [s["code"] for s in results.get("failure", [])],
        "successes": [s["code"] for s in results.get("success", [])],
        "signer": active.get("signature_info"),
    }))


main()
