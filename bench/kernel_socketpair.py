#!/usr/bin/env python3
"""Socketpair driver for the Python kernel: N x `1+1` through runcell_kernel.py, no sandbox.

Usage: python3 bench/kernel_socketpair.py KERNEL_PY [N=3000]
       KPREFIX="taskset -c 1" taskset -c 0 python3 bench/kernel_socketpair.py ...  (driver and
       kernel on different CPUs, as the server's worker and the kernel usually are)

Prints the round trip per cell, the kernel's CPU per cell and its context switches per cell
(voluntary: it blocked; one per cell is the wait for the next request, more are spurious
wake-ups). Compare two kernel files by alternating runs.
"""
import json, os, socket, struct, subprocess, sys, time

kernel_py = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
hfd = os.dup(host.fileno()); host.close(); host = socket.socket(fileno=hfd)
os.dup2(child.fileno(), 3); child.close()
p = subprocess.Popen(os.environ.get("KPREFIX","").split() + [sys.executable, kernel_py], pass_fds=(3,), stdout=subprocess.DEVNULL)
os.close(3)
buf = bytearray()
def recv():
    global buf
    while True:
        if len(buf) >= 4:
            (l,) = struct.unpack(">I", buf[:4])
            if len(buf) >= 4 + l:
                m = json.loads(bytes(buf[4:4+l])); del buf[:4+l]; return m
        c = host.recv(65536)
        if not c: raise SystemExit("eof")
        buf += c
def send(m):
    b = json.dumps(m).encode(); host.sendall(struct.pack(">I", len(b)) + b)
def stat():
    with open(f"/proc/{p.pid}/stat") as f: s = f.read().rsplit(")", 1)[1].split()
    with open(f"/proc/{p.pid}/status") as f:
        cs = {l.split(":")[0]: int(l.split()[1]) for l in f if "ctxt" in l}
    return int(s[11]) + int(s[12]), cs["voluntary_ctxt_switches"], cs["nonvoluntary_ctxt_switches"]
assert recv()["type"] == "ready"
def run(k, tag):
    for i in range(k):
        send({"type": "execute", "id": f"{tag}{i}", "code": "1+1"})
        while recv()["type"] != "done": pass
run(200, "w")
t0 = time.perf_counter(); c0 = stat()
run(n, "x")
t1 = time.perf_counter(); c1 = stat()
tck = os.sysconf("SC_CLK_TCK")
print(f"rt {1e6*(t1-t0)/n:.1f} us  kcpu {1e6*(c1[0]-c0[0])/tck/n:.1f} us  vcs/cell {(c1[1]-c0[1])/n:.2f}  nvcs/cell {(c1[2]-c0[2])/n:.2f}")
host.close(); p.wait()
