#!/usr/bin/env python3
"""CPU per one-shot run: one POST /v1/batch of N runs against a running `runcell serve`, with
the CPU of the server process and its zygotes (from /proc, before and after) and of the runs'
own sandboxes (each Execution's cgroup `cpu_ms`) divided by N. Kernel work done on no
process's behalf (a network namespace's cleanup, cgroup release) is in neither; the machine's
busy time per run (`/proc/stat`: every CPU's time but idle, iowait and the hypervisor's steal,
over the batch) has it all, and is the steadier figure on a shared machine, where runs/s move
with the neighbours' share of the cores.

  python3 bench/oneshot_cpu.py BASE_URL SERVER_PID [N=300] [CONCURRENCY=2] [CODE=print(1)]

BENCH_RUN (JSON) adds fields to every run: BENCH_RUN='{"language": "bash"}' CODE='echo 1' for a
cold one (bash has no zygote), '{"start": "cold"}' for a cold Python one-shot.
"""

import http.client
import json
import os
import sys
import time
import urllib.parse


def tree_cpu_ms(root):
    """CPU of `root` and of its children that are zygotes (`runcell __zygote`), in ms."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            stat = open(f"/proc/{pid}/stat").read()
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()
        ppid = int(rest[1])
        if pid == root or (ppid == root and b"__zygote" in cmd):
            total += (int(rest[11]) + int(rest[12])) * 1000 / tick
    return total


def machine_busy_ms():
    """Busy time of all CPUs since boot, in ms: user to softirq, without idle, iowait, steal."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) * 1000 / tick


def main():
    base, server = sys.argv[1], int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    conc = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    code = sys.argv[5] if len(sys.argv) > 5 else "print(1)"
    u = urllib.parse.urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    run = {"code": code, **json.loads(os.environ.get("BENCH_RUN", "{}"))}
    body = json.dumps({"runs": [run] * n, "concurrency": conc})
    before, busy, t = tree_cpu_ms(server), machine_busy_ms(), time.perf_counter()
    c.request("POST", "/v1/batch", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    lines = [json.loads(line) for line in r.read().split(b"\n") if line.strip()]
    secs, after = time.perf_counter() - t, tree_cpu_ms(server)
    busy = machine_busy_ms() - busy
    if len(lines) != n or any(x.get("status") != "ok" for x in lines):
        raise SystemExit(f"batch: {len(lines)} lines, not all ok: {lines[:1]}")
    sandbox = sum(x["usage"]["cpu_ms"] for x in lines) / n
    print(json.dumps({"runs": n, "concurrency": conc, "runs_per_s": round(n / secs, 1),
                      "server_and_zygotes_cpu_ms_per_run": round((after - before) / n, 2),
                      "sandbox_cgroup_cpu_ms_per_run": round(sandbox, 2),
                      "machine_busy_ms_per_run": round(busy / n, 2)}))


if __name__ == "__main__":
    main()
