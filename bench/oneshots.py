#!/usr/bin/env python3
"""One-shot runs through the HTTP API: latency of POST /v1/execute (forked from the zygote and
cold) and throughput of POST /v1/batch; every run in its own fresh sandbox, and the audit log
checked to hold every one of them afterwards.

Run by bench/oneshot.sh (which starts the server); stdlib only.

  python3 bench/oneshots.py BASE_URL OUT_JSON [--runs N] [--batch N]
"""

import http.client
import json
import statistics
import sys
import time
import urllib.parse

PRINT = "print(1)"
PANDAS = "import numpy, pandas\nprint(pandas.DataFrame({'x': numpy.arange(3)}).x.sum())"


def pct(xs, p):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * p / 100))], 2)


def stats(xs):
    return {"n": len(xs), "p50": round(statistics.median(xs), 2), "p95": pct(xs, 95),
            "p99": pct(xs, 99), "min": round(min(xs), 2)}


class Client:
    def __init__(self, base):
        u = urllib.parse.urlparse(base)
        self.host, self.port = u.hostname, u.port
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=600)

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
        return ms, json.loads(raw)

    def audited(self):
        # A fresh connection: the kept one may have been idle past the server's timeout.
        self.conn.close()
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        return self.call("GET", "/v1/audit/verify")[1]["checked"]


def execute(c, code, n, start, want, pace_ms=0):
    """n runs back to back, or `pace_ms` apart (a server with `--warm-one-shots` refills its
    prepared sandboxes in between, as it would between a client's requests)."""
    client_ms, server_ms = [], []
    for _ in range(n):
        if pace_ms:
            time.sleep(pace_ms / 1000)
        ms, e = c.call("POST", "/v1/execute", {"code": code, "start": start})
        if e["status"] != "ok" or e["stdout"] != want:
            raise RuntimeError(f"{code!r}: {e['status']} {e['stdout']!r} {e.get('error')}")
        client_ms.append(ms)
        server_ms.append(e["usage"]["wall_ms"])
    return {"client": stats(client_ms), "server_wall": stats(server_ms)}


def batch(c, n, concurrency):
    """One batch of n print(1) runs; runs/s from the request to the last line."""
    body = json.dumps({"runs": [{"code": PRINT}] * n, "concurrency": concurrency}).encode()
    conn = http.client.HTTPConnection(c.host, c.port, timeout=600)
    t = time.perf_counter()
    conn.request("POST", "/v1/batch", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"batch: {r.status} {r.read()[:300]!r}")
    seen, ids = set(), set()
    for line in r:
        v = json.loads(line)
        if v.get("status") != "ok" or v.get("stdout") != "1\n":
            raise RuntimeError(f"batch line: {line[:300]!r}")
        seen.add(v["index"])
        ids.add(v["id"])
    secs = time.perf_counter() - t
    if len(seen) != n or len(ids) != n:
        raise RuntimeError(f"batch: {len(seen)} indices, {len(ids)} ids for {n} runs")
    return {"runs": n, "concurrency": concurrency, "seconds": round(secs, 2),
            "runs_per_s": round(n / secs, 1)}


def main():
    base, out = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    runs = int(args[args.index("--runs") + 1]) if "--runs" in args else 200
    batch_n = int(args[args.index("--batch") + 1]) if "--batch" in args else 2000
    c = Client(base)
    before = c.audited()
    # Warm-up: the first runs pay for page-cache misses.
    execute(c, PRINT, 10, "zygote", "1\n")
    execute(c, PANDAS, 3, "zygote", "3\n")
    res = {
        "execute_print_zygote": execute(c, PRINT, runs, "zygote", "1\n"),
        "execute_pandas_zygote": execute(c, PANDAS, runs // 2, "zygote", "3\n"),
        "execute_print_paced": execute(c, PRINT, runs // 2, "zygote", "1\n", pace_ms=20),
        "execute_pandas_paced": execute(c, PANDAS, runs // 4, "zygote", "3\n", pace_ms=20),
        "execute_print_cold": execute(c, PRINT, runs // 4, "cold", "1\n"),
        "execute_pandas_cold": execute(c, PANDAS, 10, "cold", "3\n"),
    }
    res["batches"] = [batch(c, batch_n, k) for k in (2, 4, 8)]
    total = 13 + runs + runs // 2 + runs // 2 + runs // 4 + runs // 4 + 10 + 3 * batch_n
    res["audited"] = {"expected": total, "recorded": c.audited() - before}
    if res["audited"]["recorded"] != total:
        raise RuntimeError(f"audit log: {res['audited']}")
    json.dump(res, open(out, "w"), indent=2)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
