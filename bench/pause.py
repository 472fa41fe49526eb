#!/usr/bin/env python3
"""Pause and resume through the HTTP API (issue 17's speed goal): a session holding a 10 MB
DataFrame and a fitted scikit-learn model (a 50-tree forest), on a real `runcell serve`.

Usage: bench/pause.py [BINARY=target/release/runcell] [N=20] [PAUSED=1000] [PRELOAD]
  RUNTIMES  a directory of installed runtimes, linked into the bench's data dir (default
            target/tmp/runcell-test-runtimes/runtimes, what the tests install)
  PRELOAD   the zygote's modules (serve --preload); default: the server's own default
  RUST_LOG, LOG  the server's log filter (default warn) and the file its log goes to, e.g.
            RUST_LOG=runcell_engine::durable=debug,runcell_engine=info LOG=/tmp/pause.log for
            the time of each step of a pause and a resume

Prints, in one run (a shared machine's absolute numbers move; compare within a run):
  create     POST /v1/sessions, p50/p90 (what the preload costs a create)
  pause      POST .../pause of the session, p50/p90 (snapshot, copy to the data dir, kernel end)
  resume     POST .../execute `df.shape` on the paused session, to its reply: resume to the
             first result (a zygote fork, the snapshot read back, the cell)
  explicit   POST .../resume, then the first execute, each
  snapshot   the snapshot's size on disk
  paused     PAUSED small sessions paused: once their workspaces are unmounted (30 s after the
             pause), what they hold: mounts, loop devices, cgroups, processes, the server's
             descriptors and RSS, MemAvailable; the listing's time; resumes among them
"""
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "target/release/runcell")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
paused_n = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
preload = sys.argv[4] if len(sys.argv) > 4 else None
runtimes = os.environ.get("RUNTIMES", os.path.join(root, "target/tmp/runcell-test-runtimes/runtimes"))
# RUST_LOG=runcell_engine::durable=debug,runcell_engine=info LOG=FILE: each step's time.
log_filter = os.environ.get("RUST_LOG", "warn")
log_file = os.environ.get("LOG")

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


def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.loads(r.read() or b"null")
    return out, (time.perf_counter() - t) * 1000


def stats(name, xs):
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(len(xs) * 0.9))]
    print(f"{name:10} p50 {statistics.median(xs):8.1f} ms   p90 {p90:8.1f} ms   (n={len(xs)})")


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def descendants(pid):
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children = {}
    for line in out.splitlines():
        p, pp = (int(x) for x in line.split())
        children.setdefault(pp, []).append(p)
    n, todo = 0, [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            n += 1
            todo.append(c)
    return n


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name):
                return line
    return None


def mem_available_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def mounts_under(path):
    return sum(1 for l in open("/proc/self/mountinfo") if l.split(" ")[4].startswith(path + "/"))


def loops_under(path):
    n = 0
    for dev in os.listdir("/sys/block"):
        try:
            with open(f"/sys/block/{dev}/loop/backing_file") as f:
                n += f.read().strip().startswith(path + "/")
        except OSError:
            pass
    return n


def cgroups_of(uids):
    prefixes = tuple(f"rc-{u}-" for u in uids)
    n = 0
    for root in ["/sys/fs/cgroup/runcell"] + [f"/sys/fs/cgroup/{h}/runcell" for h in os.listdir("/sys/fs/cgroup")]:
        try:
            n += sum(1 for d in os.listdir(root) if d.startswith(prefixes))
        except OSError:
            pass
    return n


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def paused_phase(base, data, srv):
    """PAUSED small sessions paused at once: what each costs (nothing, is the goal: no
    process, cgroup, mount, loop device or descriptor once its workspace is unmounted 30 s
    after the pause), the listing and resumes among them, and a SIGTERM."""
    workspaces, images = os.path.join(data, "workspaces"), os.path.join(data, "workspace-images")
    time.sleep(2)
    mem0, rss0, fds0, procs0 = mem_available_kb(), rss_kb(srv.pid), open_fds(srv.pid), descendants(srv.pid)
    spares = loops_under(os.path.join(images, "spares"))
    ids, uids = [], []
    t = time.perf_counter()
    for i in range(paused_n):
        s, _ = call("POST", base + "/v1/sessions", {"limits": {"memory_mb": 64, "disk_mb": 16}})
        call("POST", f"{base}/v1/sessions/{s['id']}/execute", {"code": f"v = {i}"})
        uids.append(os.stat(os.path.join(workspaces, s["id"])).st_uid)
        call("POST", f"{base}/v1/sessions/{s['id']}/pause")
        ids.append(s["id"])
    made = time.perf_counter() - t
    gauge = metric(base, 'runcell_sessions{state="paused"}')
    print(f"paused     {paused_n} sessions (create, a cell, pause) in {made:.1f} s; {gauge}")
    print(f"  right after: workspaces mounted {mounts_under(workspaces)}, session loop devices "
          f"{loops_under(images) - loops_under(os.path.join(images, 'spares'))}")
    # Their workspaces are unmounted 30 s after each pause (the expiry thread, every second).
    deadline = time.time() + 120
    while mounts_under(workspaces) and time.time() < deadline:
        time.sleep(1)
    time.sleep(2)
    mem1 = mem_available_kb()
    session_loops = loops_under(images) - loops_under(os.path.join(images, "spares"))
    print(f"  once unmounted: workspaces mounted {mounts_under(workspaces)}, session loop devices {session_loops}, "
          f"cgroups of theirs {cgroups_of(uids)}, processes under the server {descendants(srv.pid)} "
          f"(before: {procs0}: the zygote and its helpers), server fds {fds0} -> {open_fds(srv.pid)}, "
          f"server RSS {rss0 // 1024} -> {rss_kb(srv.pid) // 1024} MiB, "
          f"MemAvailable {mem0 // 1024} -> {mem1 // 1024} MiB ({(mem0 - mem1) / paused_n:.0f} KiB per paused session; "
          f"a shared machine: other processes move it too)")
    lists = []
    for _ in range(5):
        out, ms = call("GET", base + "/v1/sessions")
        lists.append(ms)
    listed = sum(1 for x in out["sessions"] if x["status"] == "paused")
    stats("list", lists)
    print(f"           listed {listed} paused of {len(out['sessions'])}")
    for k in (0, paused_n // 2, paused_n - 1):
        e, ms = call("POST", f"{base}/v1/sessions/{ids[k]}/execute", {"code": "v"})
        assert e["results"][0]["data"]["text/plain"] == str(k), e
        print(f"           session {k} resumed (mounted again) to its first result in {ms:.1f} ms")
    t = time.perf_counter()
    srv.send_signal(signal.SIGTERM)
    srv.wait(timeout=120)
    print(f"SIGTERM    with {paused_n - 3} paused and 3 live: the server stopped in {time.perf_counter() - t:.1f} s")
    left = mounts_under(data)
    if left:
        # A SIGTERM keeps the paused sessions' workspaces for the next start: unmounted here
        # so the bench leaves nothing mounted.
        for line in open("/proc/self/mountinfo").read().splitlines()[::-1]:
            m = line.split(" ")[4]
            if m.startswith(data + "/"):
                subprocess.run(["umount", "-l", m])


def main():
    data = tempfile.mkdtemp(prefix="runcell-bench-pause-")
    os.symlink(runtimes, os.path.join(data, "runtimes"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    args = [binary, "serve", "--listen", f"127.0.0.1:{port}", "--warm-sessions", "0"]
    if preload:
        args += ["--preload", preload]
    srv = subprocess.Popen(args, env=dict(os.environ, RUNCELL_DATA_DIR=data, RUST_LOG=log_filter),
                           stderr=subprocess.PIPE, text=True)
    for line in srv.stderr:
        if "runcell serving on" in line:
            break
    # The rest of the log goes to LOG (or nowhere), read on a thread so the server never
    # blocks on a full pipe.
    def drain(out=open(log_file, "w") if log_file else None):
        for line in srv.stderr:
            if out:
                out.write(line)
                out.flush()
    threading.Thread(target=drain, daemon=True).start()
    # The zygote preloads in the background: wait for it (a create before it starts cold).
    deadline = time.time() + 120
    while time.time() < deadline:
        s, _ = call("POST", base + "/v1/sessions", {})
        urllib.request.urlopen(urllib.request.Request(f"{base}/v1/sessions/{s['id']}", method="DELETE"))
        if s.get("start") == "zygote":
            break
        time.sleep(1)
    try:
        creates, pauses, resumes, explicit, first, sizes = [], [], [], [], [], []
        for i in range(n):
            s, ms = call("POST", base + "/v1/sessions", {"limits": {"memory_mb": 2048}})
            creates.append(ms)
            sid = s["id"]
            e, _ = call("POST", f"{base}/v1/sessions/{sid}/execute", {"code": STATE, "timeout_s": 120})
            assert e["status"] == "ok", e
            p, ms = call("POST", f"{base}/v1/sessions/{sid}/pause")
            assert p["status"] == "paused", p
            pauses.append(ms)
            with open(os.path.join(data, "snapshots", f"{sid}.json")) as f:
                size = json.load(f).get("bytes")  # an older server's description has none
            sizes.append(size or os.path.getsize(os.path.join(data, "snapshots", f"{sid}.snap")))
            e, ms = call("POST", f"{base}/v1/sessions/{sid}/execute", {"code": "df.shape, model.n_estimators"})
            assert e["results"][0]["data"]["text/plain"] == "((262144, 5), 50)", e
            assert "model" in e["restored"]["names"], e
            resumes.append(ms)
            call("POST", f"{base}/v1/sessions/{sid}/pause")
            r, ms = call("POST", f"{base}/v1/sessions/{sid}/resume")
            assert not r["restored"].get("files_only"), r
            explicit.append(ms)
            e, ms = call("POST", f"{base}/v1/sessions/{sid}/execute", {"code": "df.shape"})
            first.append(ms)
            urllib.request.urlopen(urllib.request.Request(f"{base}/v1/sessions/{sid}", method="DELETE"))
        print(f"preload: {preload or 'the default'}")
        if n:
            report(creates, pauses, resumes, explicit, first, sizes)
        if paused_n:
            paused_phase(base, data, srv)
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGTERM)
            srv.wait(timeout=120)
        shutil.rmtree(data, ignore_errors=True)


def report(creates, pauses, resumes, explicit, first, sizes):
    stats("create", creates)
    stats("pause", pauses)
    stats("resume", resumes)
    stats("explicit", explicit)
    stats("then cell", first)
    print(f"snapshot   {statistics.median(sizes) / 1e6:.1f} MB")


main()
