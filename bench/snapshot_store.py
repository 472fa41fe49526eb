#!/usr/bin/env python3
"""Where snapshots are kept, side by side (issue 18): pause and resume of the same session
state on `runcell serve` servers that differ only in their snapshot store, taking turns in
one run, so the ratio holds on a shared machine.

Usage: bench/snapshot_store.py [BINARY=target/release/runcell] [N=10]
  local    the default: the data dir's snapshots/ (what bench/pause.py measures)
  dir      --snapshot-dir on another directory: the same writes, plus the workspace's files
           (a tar) at each pause, which another node needs to take the session over
  s3       --snapshot-store s3://... when MOTO=PYTHON names a Python with `moto[server]`
           (e.g. the test's venv, target/moto-*/venv/bin/python): moto's server on loopback
  RUNTIMES  installed runtimes (default target/tmp/runcell-test-runtimes/runtimes)
  WORKSPACE_MB  the size of a file each session writes into its workspace (default 10)

Prints per store: pause p50/p90 (the snapshot moved out, the files kept, the kernel ended) and
resume p50/p90 (a request to the paused session, to its result), and each as a ratio of local.
"""
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "target/release/runcell")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
runtimes = os.environ.get("RUNTIMES", os.path.join(root, "target/tmp/runcell-test-runtimes/runtimes"))
moto_python = os.environ.get("MOTO")
workspace_mb = int(os.environ.get("WORKSPACE_MB", "10"))

STATE = f"""
import numpy as np, pandas as pd
df = pd.DataFrame(np.random.default_rng(0).normal(size=(10 * 1024 * 1024 // 40, 5)), columns=list("abcde"))
open("data.bin", "wb").write(bytes({workspace_mb} * 1024 * 1024))
df.shape
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.loads(r.read() or b"null")
    return out, (time.perf_counter() - t) * 1000


def serve(name, flags, env=None):
    data = tempfile.mkdtemp(prefix=f"runcell-bench-store-{name}-")
    os.symlink(runtimes, os.path.join(data, "runtimes"))
    port = free_port()
    args = [binary, "serve", "--listen", f"127.0.0.1:{port}", "--warm-sessions", "0"] + flags
    srv = subprocess.Popen(args, env=dict(os.environ, RUNCELL_DATA_DIR=data, RUST_LOG="warn", **(env or {})),
                           stderr=subprocess.PIPE, text=True)
    for line in srv.stderr:
        if "runcell serving on" in line:
            break
    else:
        raise SystemExit(f"{name}: serve exited")
    threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:  # the zygote preloads in the background
        s, _ = call("POST", base + "/v1/sessions", {})
        urllib.request.urlopen(urllib.request.Request(f"{base}/v1/sessions/{s['id']}", method="DELETE"))
        if s.get("start") == "zygote":
            break
        time.sleep(1)
    return {"name": name, "base": base, "srv": srv, "data": data, "pause": [], "resume": []}


def main():
    scratch = tempfile.mkdtemp(prefix="runcell-bench-store-")
    moto = None
    servers = []
    try:
        servers.append(serve("local", []))
        servers.append(serve("dir", ["--snapshot-dir", os.path.join(scratch, "shared")]))
        if moto_python:
            port = free_port()
            moto = subprocess.Popen([moto_python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            endpoint = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    urllib.request.urlopen(urllib.request.Request(endpoint + "/bench", method="PUT"))
                    break
                except OSError:
                    time.sleep(0.2)
            env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
                   "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
            servers.append(serve("s3", ["--snapshot-store", "s3://bench/p"], env))
        for s in servers:
            sess, _ = call("POST", s["base"] + "/v1/sessions", {"limits": {"memory_mb": 2048}})
            s["sid"] = sess["id"]
            e, _ = call("POST", f"{s['base']}/v1/sessions/{s['sid']}/execute", {"code": STATE, "timeout_s": 120})
            assert e["status"] == "ok", e
        for _ in range(n):
            for s in servers:  # taking turns: the machine's load falls on each alike
                url = f"{s['base']}/v1/sessions/{s['sid']}"
                p, ms = call("POST", url + "/pause")
                assert p["status"] == "paused", p
                s["pause"].append(ms)
                e, ms = call("POST", url + "/execute", {"code": "df.shape, len(open('data.bin','rb').read())"})
                assert e["results"][0]["data"]["text/plain"] == f"((262144, 5), {workspace_mb * 1024 * 1024})", e
                assert "df" in e["restored"]["names"], e
                s["resume"].append(ms)

        def q(xs, p):
            xs = sorted(xs)
            return xs[min(len(xs) - 1, int(p * len(xs)))]

        local = servers[0]
        print(f"{binary}, n={n}, a 10 MB DataFrame and a {workspace_mb} MiB workspace file")
        for s in servers:
            pr = statistics.median(s["pause"]) / statistics.median(local["pause"])
            rr = statistics.median(s["resume"]) / statistics.median(local["resume"])
            print(f"  {s['name']:6} pause p50 {statistics.median(s['pause']):7.1f} ms p90 {q(s['pause'], .9):7.1f}"
                  f" ({pr:.2f}x)   resume p50 {statistics.median(s['resume']):7.1f} ms p90 {q(s['resume'], .9):7.1f}"
                  f" ({rr:.2f}x)")
    finally:
        for s in servers:
            if s["srv"].poll() is None:
                s["srv"].send_signal(signal.SIGTERM)
                s["srv"].wait(timeout=120)
            shutil.rmtree(s["data"], ignore_errors=True)
        if moto:
            moto.kill()
            moto.wait()
        shutil.rmtree(scratch, ignore_errors=True)


main()
