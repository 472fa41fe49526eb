#!/usr/bin/env python3
"""Session benchmarks through the HTTP API, zygote vs. cold, with Jupyter side by side.

Run by bench/sessions.sh (which starts the servers); stdlib only. Every number is a latency
seen by an HTTP client on the same machine, over one keep-alive connection.

  python3 bench/sessions.py BASE_URL MODE OUT_JSON [--density N] [--jupyter VENV_PYTHON]

MODE names the server's configuration (zygote or cold) in the report.
"""

import http.client
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse

IMPORTS = "import numpy, pandas, matplotlib.pyplot"
HEAVY_CELL = (
    "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
    "df = pd.DataFrame({'x': np.arange(100), 'y': np.random.rand(100)})\n"
    "fig, ax = plt.subplots(); ax.plot(df.x, df.y); plt.close(fig)\n"
    "df.describe().shape"
)


class Client:
    def __init__(self, base):
        u = urllib.parse.urlparse(base)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        t = time.perf_counter()
        self.conn.request(method, path, body=data, headers=headers)
        r = self.conn.getresponse()
        raw = r.read()
        ms = (time.perf_counter() - t) * 1000
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {raw[:300]!r}")
        return ms, (json.loads(raw) if raw else None)

    def create(self):
        ms, s = self.call("POST", "/v1/sessions", {})
        return ms, s["id"]

    def execute(self, sid, code):
        ms, e = self.call("POST", f"/v1/sessions/{sid}/execute", {"code": code})
        if e["status"] != "ok":
            raise RuntimeError(f"{code!r}: {e['status']} {e.get('error')}")
        return ms, e

    def delete(self, sid):
        self.call("DELETE", f"/v1/sessions/{sid}")


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(p / 100 * len(v) + 0.5)) - 1))]


def summary(values):
    return {
        "n": len(values),
        "p50": round(pct(values, 50), 2),
        "p95": round(pct(values, 95), 2),
        "p99": round(pct(values, 99), 2),
        "mean": round(statistics.fmean(values), 2),
    }


def mem_available_kib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable")


def bench_runcell(base, density):
    c = Client(base)
    out = {}
    # Warm-up: the first requests pay for lazy start-up (kernel files, caches).
    for _ in range(3):
        _, sid = c.create()
        c.execute(sid, "1")
        c.delete(sid)

    create, ids = [], []
    for _ in range(100):
        ms, sid = c.create()
        create.append(ms)
        ids.append(sid)
    for sid in ids:
        c.delete(sid)
    out["create"] = summary(create)

    first = []
    for _ in range(30):
        t = time.perf_counter()
        _, sid = c.create()
        c.execute(sid, IMPORTS)
        first.append((time.perf_counter() - t) * 1000)
        c.delete(sid)
    out["create_plus_imports"] = summary(first)

    _, sid = c.create()
    c.execute(sid, "1+1")
    rt = [c.execute(sid, "1+1")[0] for _ in range(1000)]
    c.delete(sid)
    out["one_plus_one"] = summary(rt)

    if density:
        before = mem_available_kib()
        ids = []
        t = time.perf_counter()
        for i in range(density):
            _, sid = c.create()
            c.execute(sid, HEAVY_CELL)
            ids.append(sid)
        elapsed = time.perf_counter() - t
        time.sleep(2)
        after = mem_available_kib()
        # Still answering: a cell on the first and on the last session.
        probe = [c.execute(ids[0], "1+1")[0], c.execute(ids[-1], "1+1")[0]]
        out["density"] = {
            "sessions": density,
            "mem_available_drop_mib": round((before - after) / 1024, 1),
            "mib_per_session": round((before - after) / 1024 / density, 2),
            "seconds_to_fill": round(elapsed, 1),
            "one_plus_one_ms_after": [round(x, 2) for x in probe],
        }
        for sid in ids:
            c.delete(sid)
    return out


JUPYTER = r"""
import json, sys, time, statistics
from jupyter_client.manager import start_new_kernel

def run(kc, code):
    reply = kc.execute_interactive(code, timeout=120, output_hook=lambda m: None)
    assert reply["content"]["status"] == "ok", reply["content"]

starts = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    km, kc = start_new_kernel(kernel_name="python3")
    run(kc, sys.argv[2])
    starts.append((time.perf_counter() - t) * 1000)
    last = (km, kc)
    if len(starts) < int(sys.argv[1]):
        kc.stop_channels(); km.shutdown_kernel(now=True)
km, kc = last
run(kc, "1+1")
rt = []
for _ in range(1000):
    t = time.perf_counter()
    run(kc, "1+1")
    rt.append((time.perf_counter() - t) * 1000)
kc.stop_channels(); km.shutdown_kernel(now=True)
print(json.dumps({"start_plus_imports": starts, "one_plus_one": rt}))
"""


def bench_jupyter(python):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
    p = subprocess.run(
        [python, "-c", JUPYTER, "10", IMPORTS],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    raw = json.loads(p.stdout.strip().splitlines()[-1])
    return {
        "start_plus_imports": summary(raw["start_plus_imports"]),
        "one_plus_one": summary(raw["one_plus_one"]),
    }


def main():
    args = sys.argv[1:]
    base, mode, out_path = args[0], args[1], args[2]
    density = int(args[args.index("--density") + 1]) if "--density" in args else 0
    jupyter = args[args.index("--jupyter") + 1] if "--jupyter" in args else None
    result = {"mode": mode, "runcell": bench_runcell(base, density)}
    if jupyter:
        result["jupyter"] = bench_jupyter(jupyter)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
