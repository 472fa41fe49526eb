#!/usr/bin/env python3
"""Snapshot and restore times of the Python kernel (issue 17's speed goal): a session holding
a 10 MB DataFrame and a fitted scikit-learn model, through runcell_kernel.py over a
socketpair, no sandbox (the kernel's own work; the sandbox adds nothing to it).

Usage: RUNTIME/bin/python3 bench/snapshot.py [KERNEL_PY=crates/kernel/python/runcell_kernel.py] [N=15]
       (an interpreter with pandas and scikit-learn: the default runtime's)

Prints medians and 90th percentiles, in one run (a shared machine's absolute numbers move;
compare within a run):
  snapshot   the `snapshot` request, send to `done`, and the kernel's own duration
  restore    the `restore` request into a fresh kernel, send to `done`
  resume     restore plus the first cell's result (`df.shape`): "resume to first result"
             without the kernel's start, which a zygote fork makes a few milliseconds
  warm       restore and resume into a kernel that has imported numpy, pandas, scikit-learn
             and cloudpickle already, as a zygote that preloads them has; cold pays the
             imports (the modules are re-imported by name)
  size       the file's bytes
"""
import json, os, socket, statistics, struct, subprocess, sys, tempfile, time

here = os.path.dirname(os.path.abspath(__file__))
kernel_py = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "crates/kernel/python/runcell_kernel.py"))
n = int(sys.argv[2]) if len(sys.argv) > 2 else 15

STATE = """
import numpy as np
import pandas as pd
from sklearn.ensemble import RandomForestClassifier
rng = np.random.default_rng(0)
rows = 10 * 1024 * 1024 // (5 * 8)
df = pd.DataFrame(rng.normal(size=(rows, 5)), columns=list("abcde"))
X = df.to_numpy()[:5000]
model = RandomForestClassifier(n_estimators=50, max_depth=8, random_state=0).fit(X, X[:, 0] > 0)
int(df.memory_usage(deep=True).sum())
"""

PRELOAD = "import numpy, pandas, sklearn.ensemble, cloudpickle"


class Kernel:
    def __init__(self, cwd):
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # The kernel's end goes to fd 3; ours must not be there.
        self.sock = socket.socket(fileno=os.dup(host.fileno()))
        host.close()
        os.dup2(child.fileno(), 3)
        child.close()
        self.proc = subprocess.Popen(
            [sys.executable, kernel_py], pass_fds=(3,), cwd=cwd, stdout=subprocess.DEVNULL,
            env=dict(os.environ, MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1"),
        )
        os.close(3)
        self.buf = bytearray()
        assert self.recv()["type"] == "ready"

    def recv(self):
        while True:
            if len(self.buf) >= 4:
                (l,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + l:
                    m = json.loads(bytes(self.buf[4 : 4 + l]))
                    del self.buf[: 4 + l]
                    return m
            c = self.sock.recv(1 << 16)
            if not c:
                raise SystemExit("kernel closed the channel")
            self.buf += c

    def request(self, message):
        body = json.dumps(message).encode()
        self.sock.sendall(struct.pack(">I", len(body)) + body)
        got = []
        while True:
            m = self.recv()
            got.append(m)
            if m["type"] == "done":
                assert m["status"] == "ok", got
                return got

    def close(self):
        self.sock.close()
        self.proc.wait()


def stats(xs):
    xs = sorted(xs)
    return f"p50 {statistics.median(xs) * 1000:7.1f} ms  p90 {xs[int(0.9 * (len(xs) - 1))] * 1000:7.1f} ms"


with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "state.snap")
    a = Kernel(d)
    (held,) = [m for m in a.request({"type": "execute", "id": "s", "code": STATE}) if m["type"] == "result"]
    snap, kernel_snap, restore, resume, warm_restore, warm_resume = [], [], [], [], [], []
    for i in range(n):
        t = time.perf_counter()
        report = [m for m in a.request({"type": "snapshot", "id": f"s{i}", "path": path}) if m["type"] == "snapshotted"][0]
        snap.append(time.perf_counter() - t)
        kernel_snap.append(report["duration_us"] / 1e6)
        b = Kernel(d)
        t = time.perf_counter()
        b.request({"type": "restore", "id": f"r{i}", "path": path})
        restore.append(time.perf_counter() - t)
        b.request({"type": "execute", "id": "c", "code": "df.shape"})
        resume.append(time.perf_counter() - t)
        b.close()
        w = Kernel(d)
        w.request({"type": "execute", "id": "p", "code": PRELOAD})
        t = time.perf_counter()
        w.request({"type": "restore", "id": f"w{i}", "path": path})
        warm_restore.append(time.perf_counter() - t)
        w.request({"type": "execute", "id": "c", "code": "df.shape"})
        warm_resume.append(time.perf_counter() - t)
        w.close()
    a.close()
    print(f"session: DataFrame {int(held['data']['text/plain']) / 2**20:.1f} MiB in memory + RandomForest(50 trees)")
    print(f"size      {report['bytes'] / 2**20:.1f} MiB, names {report['names']}")
    print(f"snapshot  {stats(snap)}   (kernel's own: {stats(kernel_snap)})")
    print(f"restore   {stats(restore)}   cold")
    print(f"resume    {stats(resume)}   cold (restore + first result)")
    print(f"restore   {stats(warm_restore)}   warm")
    print(f"resume    {stats(warm_resume)}   warm (restore + first result)")
