#!/usr/bin/env python3
"""What routing between nodes costs, measured side by side in one run (bench/cluster.sh
starts the PostgreSQL and the nodes; this drives them). Standard library only.

Usage: bench/cluster.py KEY NODE_A NODE_B [NODE_C]    (node URLs, http://HOST:PORT)

1. A session on A (pinned, `x-runcell-node`); then, interleaved so the machine's swings hit
   both alike: its `GET /v1/sessions/{id}` at A and through B, and a `1+1` execute at A and
   through B. p50/p95 of each, and what going through B adds at the p50.
2. Creates from the warm pool: pinned to the node asked (made there), pinned through B to A
   (forwarded), and unpinned through each node (placed on the node with the most room);
   each session deleted at once, with a pause for the pool to refill between creates.
"""

import http.client
import json
import statistics
import sys
import time
from urllib.parse import urlsplit

N_GET = 300
N_EXEC = 150
N_CREATE = 40


class Node:
    def __init__(self, url, key):
        self.url = url
        u = urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port)
        self.key = key

    def call(self, method, path, body=None, pin=None):
        headers = {"authorization": f"Bearer {self.key}", "content-type": "application/json"}
        if pin:
            headers["x-runcell-node"] = pin
        t = time.perf_counter()
        self.conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        r = self.conn.getresponse()
        data = r.read()
        ms = (time.perf_counter() - t) * 1e3
        if r.status >= 300:
            raise SystemExit(f"{method} {self.url}{path}: {r.status} {data[:300]!r}")
        return ms, (json.loads(data) if data else None), r.getheader("x-runcell-node")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def row(name, xs):
    print(f"  {name:<44} n={len(xs):<4} p50 {statistics.median(xs):7.2f} ms  p95 {pct(xs, 0.95):7.2f} ms")


def main():
    key, urls = sys.argv[1], sys.argv[2:]
    a, b = Node(urls[0], key), Node(urls[1], key)
    nodes = [Node(u, key) for u in urls]
    _, s, where = a.call("POST", "/v1/sessions", {}, pin=a.url)
    assert where == a.url, where
    sid = s["id"]
    # Warm up both paths (connections, caches).
    for _ in range(20):
        a.call("GET", f"/v1/sessions/{sid}")
        b.call("GET", f"/v1/sessions/{sid}")
        a.call("POST", f"/v1/sessions/{sid}/execute", {"code": "1+1"})
        b.call("POST", f"/v1/sessions/{sid}/execute", {"code": "1+1"})

    get_a, get_b, ex_a, ex_b = [], [], [], []
    for i in range(N_GET):
        for node, out in ((a, get_a), (b, get_b)) if i % 2 == 0 else ((b, get_b), (a, get_a)):
            ms, _, served = node.call("GET", f"/v1/sessions/{sid}")
            assert served == a.url, served
            out.append(ms)
    for i in range(N_EXEC):
        for node, out in ((a, ex_a), (b, ex_b)) if i % 2 == 0 else ((b, ex_b), (a, ex_a)):
            ms, e, _ = node.call("POST", f"/v1/sessions/{sid}/execute", {"code": "1+1"})
            assert e["results"][0]["data"]["text/plain"] == "2", e
            out.append(ms)
    print("session-bound requests (the session is on A):")
    row("GET /v1/sessions/{id} at A (its owner)", get_a)
    row("GET /v1/sessions/{id} through B", get_b)
    row("execute 1+1 at A", ex_a)
    row("execute 1+1 through B", ex_b)
    print(f"  through B adds at the p50: GET {statistics.median(get_b) - statistics.median(get_a):+.2f} ms, "
          f"execute {statistics.median(ex_b) - statistics.median(ex_a):+.2f} ms")
    a.call("DELETE", f"/v1/sessions/{sid}")

    def creates(node, pin, expect=None):
        out, starts, placed = [], {}, {}
        for _ in range(N_CREATE):
            time.sleep(0.3)  # the warm pool refills between creates
            ms, s, where = node.call("POST", "/v1/sessions", {}, pin=pin)
            if expect:
                assert where == expect, (where, expect)
            out.append(ms)
            starts[s["start"]] = starts.get(s["start"], 0) + 1
            placed[where] = placed.get(where, 0) + 1
            node.call("DELETE", f"/v1/sessions/{s['id']}")
        return out, starts, placed

    print("creates (each deleted at once; 0.3 s between creates for the warm pool to refill):")
    for name, node, pin, expect in [
        ("pinned to A, at A (made there)", a, a.url, a.url),
        ("pinned to A, through B (forwarded)", b, a.url, a.url),
    ]:
        xs, starts, _ = creates(node, pin, expect)
        row(name, xs)
        print(f"    start: {starts}")
    for n in nodes:
        xs, starts, placed = creates(n, None)
        row(f"unpinned, through {n.url}", xs)
        print(f"    start: {starts}; placed on: {placed}")


main()
