#!/usr/bin/env bash
# Fault runs of `runcell serve`, on demand (as root): a data dir whose disk fills up, big
# workspaces (multipart uploads of many parts, a workspace of many files), kill -9 under load
# and slow or idle clients.
#
# Usage: bench/faults.sh [disk|uploads|files|kill9|slow|all=all]
#
#   disk     the data dir on an 8 MiB tmpfs: a session and one execution, then the disk is
#            filled; every write (execute, upload, create, one-shot) must be a 507
#            `insufficient_storage`, every read a 200, nothing refused may be recorded; the
#            server is stopped and started again on the full disk (it must start and serve
#            reads), then space is freed and writes must work again with no restart.
#   uploads  multipart uploads of 2,000, 5,000 and 10,000 parts into one session: each must
#            answer 201 with every part; the times show whether the cost is linear.
#   files    a workspace of 150,000 files (created by a cell): an upload must answer 201, a
#            cell that touches one file must report exactly that change, no deletion.
#   kill9    FAULTS_CLIENTS (30) clients create sessions, run cells that write a file, upload
#            files and delete sessions, logging everything the server acknowledged; the server
#            is killed -9 FAULTS_KILLS (3) times, every FAULTS_KILL_EVERY (20) s, and started
#            again on the same data dir and port. Then: every acknowledged execution is recorded
#            with its code, every acknowledged and undeleted session is listed, every file of
#            a recovered session has the bytes acknowledged, the audit chain verifies (API and
#            `runcell audit verify`), and after a clean stop no process the server started, no
#            mount of the data dir and no process or cgroup of a sandbox uid it used is left.
#   slow     --max-connections 8 and 2 s timeouts: FAULTS_IDLE (120) idle connections, 20
#            new clients past the cap, a slow-loris head, a slow body and an idle keep-alive
#            connection, while one client executes in a session. Every idle connection must be
#            closed, new clients get 200 or a 503 with Retry-After, the slow-loris is cut, the
#            slow body answered 408, the session client never fails, the server's RSS stays
#            within 200 MB of its start. (More idle connections than the listen backlog, 128,
#            plus the cap leaves some that the kernel drops and the server never sees.)
# Prints a markdown report and writes it to bench/results/faults-<timestamp>.md; exits
# non-zero on any check that fails.
#
# Environment:
#   RUNCELL_BIN          a runcell binary (default: cargo build --release -p runcell)
#   RUNCELL_BENCH_DATA   cache for the Python runtime (default /var/tmp/runcell-bench)
#   RUNCELL_BENCH_KEEP=1 keep the run's directory and server logs (always kept on a failure)
#   FAULTS_CLIENTS, FAULTS_KILLS, FAULTS_KILL_EVERY, FAULTS_IDLE  see kill9 and slow
# Needs python3 (the HTTP client is its standard library) and curl.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
case $what in disk|uploads|files|kill9|slow|all) ;;
  *) echo "usage: bench/faults.sh [disk|uploads|files|kill9|slow|all]" >&2; exit 2 ;;
esac
clients=${FAULTS_CLIENTS:-30}
kills=${FAULTS_KILLS:-3}
every=${FAULTS_KILL_EVERY:-20}
idle=${FAULTS_IDLE:-120}
for v in "$clients" "$kills" "$every" "$idle"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "FAULTS_* must be positive integers" >&2; exit 2; }
done

say() { printf '[faults] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }
[[ $EUID -eq 0 ]] || die "run as root (it mounts a tmpfs)"
command -v python3 >/dev/null || die "python3 is required"

if [[ -n ${RUNCELL_BIN:-} ]]; then
  bin=$RUNCELL_BIN
else
  say "building runcell (release)"
  cargo build --release -q -p runcell
  bin=${CARGO_TARGET_DIR:-target}/release/runcell
fi
[[ -x $bin ]] || die "no runcell binary at $bin"
bin=$(realpath "$bin")

cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
mkdir -p "$cache"
NO_COLOR=1 "$bin" runtime install --data-dir "$cache" >/dev/null 2>"$cache/install.log" ||
  { tail -20 "$cache/install.log" >&2; die "cannot install the Python runtime"; }
work=$(mktemp -d /var/tmp/runcell-faults.XXXXXX)
report=$work/report.md
server_pid=

stop_server() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=
}

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_server
  awk -v w="$work/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  if [[ ${RUNCELL_BENCH_KEEP:-0} == 1 || $rc != 0 ]]; then
    say "kept $work"
  else
    rm -rf -- "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT INT TERM

# start_server DATA LOG [PORT [SERVE ARGS...]]: serves DATA on PORT (default: a free one); sets
# $base. Waits for its "serving" line.
start_server() {
  local data=$1 log=$2 port=${3:-}
  shift 2; shift $(( $# > 0 ? 1 : 0 ))
  [[ -n $port ]] ||
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  NO_COLOR=1 RUNCELL_DATA_DIR=$data "$bin" serve --listen "127.0.0.1:$port" \
    --warm-sessions 0 "$@" >"$log" 2>&1 &
  server_pid=$!
  base=http://127.0.0.1:$port
  for _ in $(seq 1200); do
    grep -q "runcell serving on" "$log" 2>/dev/null && return 0
    kill -0 "$server_pid" 2>/dev/null || { tail -5 "$log" >&2; return 1; }
    sleep 0.1
  done
  return 1
}

new_data_dir() {
  local d=$1
  mkdir -p "$d"
  ln -s "$(realpath "$cache")/runtimes" "$d/runtimes"
}

# fill DIR NAME: writes NAME in DIR until the filesystem takes no more.
fill() { python3 - "$1/$2" <<'EOF'
import sys
with open(sys.argv[1], "wb", buffering=0) as f:
    for size in (1 << 16, 1):
        try:
            while f.write(b"\0" * size):
                pass
        except OSError:
            pass
EOF
}

# The checks themselves, in Python (stdlib HTTP). Prints report lines; exits 1 on a failure.
client=$work/client.py
cat >"$client" <<'EOF'
import json, sys, time, urllib.request, urllib.error

base = sys.argv[2]
failures = []

def call(method, path, body=None, ctype="application/json", timeout=600):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("content-type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")

def check(what, ok, detail=""):
    print(f"| {what} | {'ok' if ok else 'FAILED'} | {detail} |")
    if not ok:
        failures.append(what)

def multipart(n, prefix):
    parts = [f'--B\r\nContent-Disposition: form-data; name="file"; filename="{prefix}{i:05}.txt"\r\n\r\n{i}\n\r\n'
             for i in range(n)]
    return ("".join(parts) + "--B--\r\n").encode(), "multipart/form-data; boundary=B"

step = sys.argv[1]
if step == "disk-before":
    s, v = call("POST", "/v1/sessions", {})
    check("create before the disk fills", s == 201, s)
    sid = v["id"]
    s, e = call("POST", f"/v1/sessions/{sid}/execute", {"code": "40 + 2"})
    check("execute before the disk fills", s == 200, s)
    open(sys.argv[3], "w").write(json.dumps({"sid": sid, "ex": e["id"]}))
elif step == "disk-full":
    st = json.load(open(sys.argv[3]))
    sid = st["sid"]
    for what, (m, p, b, ct) in {
        "execute": ("POST", f"/v1/sessions/{sid}/execute", {"code": "1 + 1"}, "application/json"),
        "upload": ("PUT", f"/v1/sessions/{sid}/files/a.txt", b"hello", "application/octet-stream"),
        "create": ("POST", "/v1/sessions", {}, "application/json"),
        "one-shot": ("POST", "/v1/execute", {"code": "print(1)"}, "application/json"),
    }.items():
        s, v = call(m, p, b, ct)
        code = v.get("error", {}).get("code") if isinstance(v, dict) else v
        check(f"{what} on a full disk", s == 507 and code == "insufficient_storage", f"{s} {code}")
    for what, p in {"list sessions": "/v1/sessions", "list executions": "/v1/executions",
                    "list files": f"/v1/sessions/{sid}/files", "verify audit": "/v1/audit/verify"}.items():
        s, v = call("GET", p)
        check(f"{what} on a full disk", s == 200, s)
    s, v = call("GET", "/v1/executions")
    ids = [e["id"] for e in v["executions"]]
    check("nothing refused was recorded", ids == [st["ex"]], f"{len(ids)} recorded")
elif step == "disk-restarted":
    s, v = call("GET", "/v1/executions")
    check("reads after a start on the full disk", s == 200 and len(v["executions"]) == 1, s)
    s, v = call("GET", "/v1/audit/verify")
    check("audit chain intact", s == 200 and v.get("ok") is True, v)
    s, v = call("POST", "/v1/sessions", {})
    check("create after a start on the full disk", s == 507, s)
elif step == "disk-freed":
    s, v = call("POST", "/v1/sessions", {})
    check("create once space is freed", s == 201, s)
    sid = v["id"]
    s, e = call("POST", f"/v1/sessions/{sid}/execute", {"code": "6 * 7"})
    check("execute once space is freed", s == 200 and e["results"][0]["data"]["text/plain"] == "42", s)
    s, v = call("PUT", f"/v1/sessions/{sid}/files/a.txt", b"hi", "application/octet-stream")
    check("upload once space is freed", s == 201, s)
elif step == "uploads":
    s, v = call("POST", "/v1/sessions", {})
    sid = v["id"]
    for n in (2000, 5000, 10000):
        body, ct = multipart(n, f"u{n}-")
        t = time.monotonic()
        s, v = call("POST", f"/v1/sessions/{sid}/files?path=up{n}", body, ct)
        dt = time.monotonic() - t
        got = len(v["files"]) if s == 201 else 0
        check(f"multipart upload of {n} parts", s == 201 and got == n, f"{dt:.2f} s, {dt / n * 1e3:.2f} ms a part")
elif step == "files":
    s, v = call("POST", "/v1/sessions", {})
    sid = v["id"]
    t = time.monotonic()
    s, e = call("POST", f"/v1/sessions/{sid}/execute", {"timeout_s": 600, "code":
        "import os\nos.makedirs('big', exist_ok=True)\nfor i in range(150000):\n    open(f'big/{i:06}', 'w').close()\nlen(os.listdir('big'))"})
    dt = time.monotonic() - t
    check("a cell creates 150,000 files", s == 200 and e["results"][0]["data"]["text/plain"] == "150000",
          f"{dt:.2f} s; {len(e.get('files', []))} changes listed, truncated.files={e.get('truncated', {}).get('files')}")
    t = time.monotonic()
    s, v = call("PUT", f"/v1/sessions/{sid}/files/big/upload.txt", b"x", "application/octet-stream")
    check("an upload into 150,000 files", s == 201, f"{s}, {time.monotonic() - t:.3f} s")
    t = time.monotonic()
    s, e = call("POST", f"/v1/sessions/{sid}/execute", {"code": "open('big/000007', 'w').write('x')"})
    dt = time.monotonic() - t
    changes = [(f["path"], f["change"]) for f in e.get("files", [])]
    check("a cell touching one of 150,000 files", s == 200 and changes == [("big/000007", "modified")],
          f"{dt:.2f} s, changes {changes[:3]}")
    t = time.monotonic()
    s, v = call("GET", f"/v1/sessions/{sid}/files?path=big")
    check("listing 150,001 files", s == 200 and len(v["files"]) == 150001, f"{time.monotonic() - t:.2f} s")
elif step == "kill9-load":
    # Clients that log every request the server acknowledged, while bash kill -9s the server.
    import hashlib, os, random, threading
    logdir, nclients, stop = sys.argv[3], int(sys.argv[4]), sys.argv[5]
    errors = {}
    lock = threading.Lock()

    def note(what):
        with lock:
            errors[what] = errors.get(what, 0) + 1

    def worker(i):
        rnd = random.Random(i)
        log = open(f"{logdir}/acks-{i}.jsonl", "a", buffering=1)
        ack = lambda **kv: log.write(json.dumps(kv) + "\n")
        sid, n = None, 0
        while not os.path.exists(stop):
            n += 1
            tag = f"c{i}-{n}"
            try:
                if sid is None:
                    s, v = call("POST", "/v1/sessions", {"limits": {"memory_mb": 256}}, timeout=120)
                    if s == 201:
                        sid = v["id"]
                        ack(k="create", sid=sid)
                    else:
                        note(f"create {s}")
                        time.sleep(0.2)
                    continue
                r = rnd.random()
                if r < 0.55:
                    code = (f"import os\nos.makedirs('x', exist_ok=True)\n"
                            f"open('x/{tag}.txt', 'w').write('{tag}')\n'{tag}'")
                    s, e = call("POST", f"/v1/sessions/{sid}/execute", {"code": code}, timeout=120)
                    if s == 200:
                        ok = e.get("status") == "ok" and e["results"][0]["data"]["text/plain"] == repr(tag)
                        ack(k="exec", sid=sid, id=e["id"], code=code, path=f"x/{tag}.txt" if ok else None,
                            sha=hashlib.sha256(tag.encode()).hexdigest())
                        if not ok:
                            note(f"execute 200 but {e.get('status')}")
                    elif s in (404, 409):
                        note(f"execute {s} (session gone)")
                        sid = None
                    else:
                        note(f"execute {s}")
                elif r < 0.95:
                    body = rnd.randbytes(rnd.randint(1, 65536))
                    path = f"u/{tag}.bin"
                    s, v = call("PUT", f"/v1/sessions/{sid}/files/{path}", body, "application/octet-stream", timeout=120)
                    if s == 201:
                        ack(k="upload", sid=sid, path=path, sha=hashlib.sha256(body).hexdigest())
                    elif s in (404, 409):
                        note(f"upload {s} (session gone)")
                        sid = None
                    else:
                        note(f"upload {s}")
                else:
                    # Whether or not it is acknowledged, the session is no longer checked.
                    ack(k="delete", sid=sid)
                    s, _ = call("DELETE", f"/v1/sessions/{sid}", timeout=120)
                    if s not in (204, 404, 409):
                        note(f"delete {s}")
                    sid = None
            except (OSError, urllib.error.URLError, ValueError, KeyError, IndexError) as x:
                # The server being killed: refused, reset or cut short. Not acknowledged.
                note(f"connection: {type(x).__name__}")
                time.sleep(0.2)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(nclients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(errors, sort_keys=True))
elif step == "kill9-verify":
    # Everything a client was told happened must still be there.
    import glob
    logdir = sys.argv[3]
    acks = [json.loads(l) for f in sorted(glob.glob(f"{logdir}/acks-*.jsonl")) for l in open(f)]
    deleted = {a["sid"] for a in acks if a["k"] == "delete"}
    creates = [a for a in acks if a["k"] == "create"]
    execs = [a for a in acks if a["k"] == "exec"]
    uploads = [a for a in acks if a["k"] == "upload"]
    lost = []
    for a in execs:
        s, v = call("GET", f"/v1/executions/{a['id']}")
        if s != 200 or v.get("code") != a["code"] or v.get("session_id") != a["sid"]:
            lost.append(f"execution {a['id']}: {s}")
    check("every acknowledged execution is recorded with its code", not lost,
          f"{len(execs)} acknowledged, {len(lost)} lost {lost[:3]}")
    status = {}
    missing = []
    for a in creates:
        if a["sid"] in deleted:
            continue
        s, v = call("GET", f"/v1/sessions/{a['sid']}")
        st = v.get("status") if s == 200 else f"HTTP {s}"
        status[a["sid"]] = st
        if s != 200:
            missing.append(a["sid"])
    counts = {}
    for st in status.values():
        counts[st] = counts.get(st, 0) + 1
    check("every acknowledged, undeleted session is listed", not missing,
          f"{len(creates)} created, {len(deleted)} deleted, after the kills: {counts}")
    bad, checked, unreadable = [], 0, 0
    import hashlib
    for a in uploads + [e for e in execs if e.get("path")]:
        st = status.get(a["sid"])
        if st is None:
            continue
        if st != "ready" and st != "busy":
            unreadable += 1
            continue
        req = urllib.request.Request(f"{base}/v1/sessions/{a['sid']}/files/{a['path']}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                got = hashlib.sha256(r.read()).hexdigest()
        except urllib.error.HTTPError as e:
            got = f"HTTP {e.code}"
        checked += 1
        if got != a["sha"]:
            bad.append(f"{a['sid']}/{a['path']}: {got[:12]}")
    check("every acknowledged file of a recovered session has its bytes", not bad,
          f"{len(uploads)} uploads acknowledged; {checked} files checked in recovered sessions, "
          f"{unreadable} in dead ones not readable, {len(bad)} wrong {bad[:3]}")
    s, v = call("GET", "/v1/audit/verify")
    check("audit chain verifies (API)", s == 200 and v.get("ok") is True, f"{v.get('checked')} records")
    open(f"{logdir}/summary.json", "w").write(json.dumps(
        {"creates": len(creates), "execs": len(execs), "uploads": len(uploads), "lost": len(lost) + len(bad) + len(missing)}))
elif step == "watch":
    # Every process below the server (pid, start time, uid) and every workspace owner, until told
    # to stop: what must be gone once the server is stopped.
    import os
    pidfile, data, out, stop = sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
    seen, uids = set(), set()

    def stat(p):
        raw = open(f"/proc/{p}/stat").read()
        f = raw[raw.rindex(")") + 2:].split()
        return int(f[1]), f[19]  # ppid, start time

    while not os.path.exists(stop):
        try:
            root = int(open(pidfile).read())
        except (OSError, ValueError):
            root = None
        procs = {}
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    procs[int(p)] = (*stat(p), os.stat(f"/proc/{p}").st_uid)
                except (OSError, ValueError):
                    pass
        for p, (pp, start, uid) in procs.items():
            q, hops = p, 0
            while q in procs and q != root and hops < 64:
                q, hops = procs[q][0], hops + 1
            if root is not None and q == root and p != root:
                seen.add((p, start))
                if uid >= 2000000000:
                    uids.add(uid)
        try:
            for w in os.listdir(f"{data}/workspaces"):
                u = os.stat(f"{data}/workspaces/{w}").st_uid
                if u >= 2000000000:
                    uids.add(u)
        except OSError:
            pass
        time.sleep(0.5)
    json.dump({"procs": sorted(seen), "uids": sorted(uids)}, open(out, "w"))
elif step == "leaks":
    # After a clean stop: none of the server's processes, no mount of its data dir, and no
    # process or cgroup of a sandbox uid it used (unless another server holds that uid now).
    import glob, os
    data, watched = sys.argv[3], json.load(open(sys.argv[4]))
    # Sandboxes end on their own once the server is gone: give them a few seconds.
    time.sleep(5)
    alive = []
    for p, start in watched["procs"]:
        try:
            raw = open(f"/proc/{p}/stat").read()
            if raw[raw.rindex(")") + 2:].split()[19] == start:
                alive.append(p)
        except OSError:
            pass
    check("no process of the server left", not alive, f"{len(watched['procs'])} seen during the run; left: {alive[:5]}")
    mounts = [l.split()[4] for l in open("/proc/self/mountinfo") if f" {data}/" in l or f" {data} " in l]
    check("no mount of the data dir left", not mounts, f"{mounts[:3]}")
    held_inodes = {l.split()[5].split(":")[2] for l in open("/proc/locks") if len(l.split()) > 5}
    free, busy = [], 0
    for u in watched["uids"]:
        try:
            ino = str(os.stat(f"/run/runcell/uids/{u}").st_ino)
        except OSError:
            ino = None
        if ino in held_inodes:
            busy += 1
        else:
            free.append(u)
    procs = [p for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}")
             and os.stat(f"/proc/{p}").st_uid in set(free)]
    cgroups = [c for u in free for c in glob.glob(f"/sys/fs/cgroup/*/**/runcell/rc-{u}-*", recursive=True)]
    check("no sandbox process or cgroup left", not procs and not cgroups,
          f"{len(watched['uids'])} sandbox uids used ({busy} leased again by another server, not checked); "
          f"processes {procs[:3]}, cgroups {cgroups[:3]}")
elif step == "slow":
    # Idle, slow-loris and slow-body connections past the connection cap while one client keeps
    # executing in a session. Timeouts: sys.argv[4] seconds for headers, keep-alive and bodies.
    import http.client, os, socket, threading
    server_pid, tmo, idle_n = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    host, port = base.rsplit("/", 1)[1].split(":")
    port = int(port)
    rss = lambda: int(next(l.split()[1] for l in open(f"/proc/{server_pid}/status") if l.startswith("VmRSS")))
    rss0 = rss()
    s, v = call("POST", "/v1/sessions", {})
    sid = v["id"]
    done = threading.Event()
    normal = {"ok": 0, "fail": [], "refused": 0, "reconnects": 0}

    def normal_client():
        conn = None
        i = 0
        while not done.is_set():
            i += 1
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, port, timeout=60)
                    normal["reconnects"] += 1
                conn.request("POST", f"/v1/sessions/{sid}/execute",
                             json.dumps({"code": f"sum(range({i}))"}), {"content-type": "application/json"})
                r = conn.getresponse()
                body = json.loads(r.read())
                if r.status == 200 and body["results"][0]["data"]["text/plain"] == str(sum(range(i))):
                    normal["ok"] += 1
                elif r.status == 503:
                    normal["refused"] += 1  # a new connection past the cap: allowed, retried
                    conn.close()
                    conn = None
                    time.sleep(0.2)
                else:
                    normal["fail"].append(f"{r.status} {body}"[:200])
                if r.getheader("connection", "").lower() == "close" and conn is not None:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException, ValueError) as x:
                normal["fail"].append(f"{type(x).__name__}: {x}"[:200])
                conn = None

    t = threading.Thread(target=normal_client)
    t.start()
    time.sleep(1)

    def closed_after(sock, t0, limit):
        # Seconds until the server closes the connection (or answers and closes), None if not.
        sock.settimeout(0.2)
        answer = b""
        while time.monotonic() - t0 < limit:
            try:
                chunk = sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return time.monotonic() - t0, answer
            if not chunk:
                return time.monotonic() - t0, answer
            answer += chunk
        return None, answer

    # Idle connections past the cap, each in its own thread: connected (at once, or once the
    # server accepts again: past the cap it leaves them in the listen backlog), then closed by
    # the server's header timeout. Meanwhile new clients past the cap send a request: 200 or 503.
    limit = tmo * 30 + 30
    results = [None] * idle_n

    def idle_one(k):
        c = socket.socket()
        c.settimeout(limit)
        try:
            c.connect((host, port))
        except OSError:
            results[k] = ("no connect", None)
            return
        results[k] = ("connected", *closed_after(c, time.monotonic(), limit))
        c.close()

    ws = [threading.Thread(target=idle_one, args=(k,)) for k in range(idle_n)]
    for w in ws:
        w.start()
    time.sleep(1)
    rss_peak = rss()
    statuses = {}

    def past_cap():
        try:
            c = http.client.HTTPConnection(host, port, timeout=limit)
            c.request("GET", "/healthz", headers={"host": f"{host}:{port}"})
            r = c.getresponse()
            r.read()
            st = r.status if r.status != 503 or r.getheader("retry-after") else "503 without Retry-After"
        except (OSError, http.client.HTTPException) as x:
            st = type(x).__name__
        statuses[st] = statuses.get(st, 0) + 1

    pc = [threading.Thread(target=past_cap) for _ in range(20)]
    for w in pc:
        w.start()
    for w in ws + pc:
        w.join()
    rss_peak = max(rss_peak, rss())
    closed = [r[1] for r in results if r[0] == "connected" and r[1] is not None]
    opened = sum(1 for r in results if r[0] == "connected")
    check("every idle connection is closed", len(closed) == opened and opened > 0,
          f"{opened} of {idle_n} connected, {len(closed)} closed by the server, "
          f"{min(closed or [0]):.1f}-{max(closed or [0]):.1f} s after connecting (header timeout {tmo:g} s)")
    check("new clients past the cap get 200 or an explicit 503", set(statuses) <= {200, 503},
          f"{statuses}")
    # A slow-loris head: one byte every half second, never finished.
    loris = socket.create_connection((host, port))
    lt0 = time.monotonic()
    head = f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nX-Slow: ".encode() + b"a" * 10000
    lres = [None]

    def trickle(sock, data, step, every, res, t0):
        for k in range(0, len(data), step):
            if time.monotonic() - t0 > limit:
                break
            try:
                sock.sendall(data[k:k + step])
            except OSError:
                break
            time.sleep(every)
            if res[0] is not None:
                break

    def loris_wait():
        lres[0] = closed_after(loris, lt0, limit)
    lw = threading.Thread(target=loris_wait)
    lw.start()
    trickle(loris, head, 1, 0.5, lres, lt0)
    lw.join()
    # A slow body: a 1 MB upload sent at 100 bytes a second.
    body = socket.create_connection((host, port))
    body.sendall(f"PUT /v1/sessions/{sid}/files/slow.bin HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 1000000\r\n"
                 "Content-Type: application/octet-stream\r\n\r\n".encode())
    bt0 = time.monotonic()
    bres = [None]

    def body_wait():
        bres[0] = closed_after(body, bt0, limit)
    bw = threading.Thread(target=body_wait)
    bw.start()
    trickle(body, b"x" * 1000000, 50, 0.5, bres, bt0)
    bw.join()
    # An idle keep-alive connection after one request.
    ka = http.client.HTTPConnection(host, port, timeout=10)
    for attempt in range(40):
        try:
            ka.request("GET", "/healthz", headers={"host": f"{host}:{port}"})
            r = ka.getresponse()
            r.read()
            if r.status == 200:
                break
        except (OSError, http.client.HTTPException):
            pass
        ka.close()
        time.sleep(0.5)
    kt0 = time.monotonic()
    kres = closed_after(ka.sock, kt0, limit) if ka.sock else (None, b"")
    rss_after_idle = rss()
    done.set()
    t.join()
    lt = lres[0][0] if lres[0] else None
    check("a slow-loris head is cut", lt is not None and lt < tmo * 4 + 5,
          f"after {lt if lt is not None else -1:.1f} s: {lres[0][1][:40] if lres[0] else b''!r}")
    bt = bres[0][0] if bres[0] else None
    check("a slow body is answered 408 and cut", bt is not None and bres[0][1].startswith(b"HTTP/1.1 408"),
          f"after {bt if bt is not None else -1:.1f} s: {bres[0][1][:40] if bres[0] else b''!r}")
    check("an idle keep-alive connection is closed", kres[0] is not None and kres[0] < tmo * 4 + 5,
          f"after {kres[0] if kres[0] is not None else -1:.1f} s")
    s, v = call("GET", f"/v1/sessions/{sid}")
    check("the normal client never failed", not normal["fail"] and normal["ok"] > 0 and v.get("status") in ("ready", "busy"),
          f"{normal['ok']} executions ok, {normal['refused']} 503s at reconnect, {normal['reconnects']} connections, "
          f"failures {normal['fail'][:3]}, session {v.get('status')}")
    check("server memory stays bounded", rss_peak - rss0 < 200 * 1024 and rss_after_idle - rss0 < 200 * 1024,
          f"RSS {rss0 / 1024:.0f} MB before, {rss_peak / 1024:.0f} MB with the connections open, "
          f"{rss_after_idle / 1024:.0f} MB after")
sys.exit(1 if failures else 0)
EOF

rc=0
{
  echo "# Fault runs ($(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo
  echo "Binary: \`$bin\`; host: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%d GiB", $2/1048576}' /proc/meminfo)."
  echo
  echo "| Check | Result | Detail |"
  echo "|:---|:---|:---|"
} >"$report"

if [[ $what == disk || $what == all ]]; then
  say "disk: the data dir on an 8 MiB tmpfs"
  disk=$work/disk
  mkdir -p "$disk"
  mount -t tmpfs -o size=8m,mode=0700 tmpfs "$disk"
  new_data_dir "$disk"
  start_server "$disk" "$work/disk-1.log" || die "serve did not start"
  python3 "$client" disk-before "$base" "$work/state.json" >>"$report" || rc=1
  fill "$disk" filler
  python3 "$client" disk-full "$base" "$work/state.json" >>"$report" || rc=1
  stop_server
  fill "$disk" filler2
  t0=$(date +%s.%N)
  if start_server "$disk" "$work/disk-2.log"; then
    t1=$(date +%s.%N)
    echo "| serve starts on the full disk | ok | $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f s", b - a}') |" >>"$report"
    python3 "$client" disk-restarted "$base" >>"$report" || rc=1
    rm -f "$disk/filler" "$disk/filler2"
    python3 "$client" disk-freed "$base" >>"$report" || rc=1
  else
    echo "| serve starts on the full disk | FAILED | $(tail -1 "$work/disk-2.log") |" >>"$report"
    rc=1
  fi
  stop_server
  umount "$disk"
fi

if [[ $what == uploads || $what == all || $what == files ]]; then
  data=$work/data
  new_data_dir "$data"
  start_server "$data" "$work/serve.log" || die "serve did not start"
  if [[ $what != files ]]; then
    say "uploads: 2,000, 5,000 and 10,000 parts"
    python3 "$client" uploads "$base" >>"$report" || rc=1
  fi
  if [[ $what != uploads ]]; then
    say "files: a workspace of 150,000 files"
    python3 "$client" files "$base" >>"$report" || rc=1
  fi
  stop_server
fi

if [[ $what == kill9 || $what == all ]]; then
  say "kill9: $clients clients, $kills kill -9s, one every ${every} s"
  data=$work/kill9
  new_data_dir "$data"
  mkdir -p "$work/acks"
  start_server "$data" "$work/kill9-0.log" || die "serve did not start"
  port=${base##*:}
  echo "$server_pid" >"$work/server.pid"
  python3 "$client" watch "$base" "$work/server.pid" "$data" "$work/watched.json" "$work/watch.stop" &
  watch_pid=$!
  python3 "$client" kill9-load "$base" "$work/acks" "$clients" "$work/load.stop" >"$work/load-errors.json" &
  load_pid=$!
  recovery=
  for k in $(seq "$kills"); do
    sleep "$every"
    kill -KILL "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    server_pid=
    t0=$(date +%s.%N)
    start_server "$data" "$work/kill9-$k.log" "$port" || die "serve did not start again after kill $k"
    echo "$server_pid" >"$work/server.pid"
    took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f s", b - a}')
    recovery+="$took "
    say "kill $k: serving again after $took"
  done
  sleep "$every"
  touch "$work/load.stop"
  wait "$load_pid" || rc=1
  python3 "$client" kill9-verify "$base" "$work/acks" >>"$report" || rc=1
  stop_server
  touch "$work/watch.stop"
  wait "$watch_pid" || rc=1
  if NO_COLOR=1 "$bin" audit verify --data-dir "$data" >"$work/audit.txt" 2>&1; then
    echo "| \`runcell audit verify\` after the clean stop | ok | $(tail -1 "$work/audit.txt") |" >>"$report"
  else
    echo "| \`runcell audit verify\` after the clean stop | FAILED | $(tail -1 "$work/audit.txt") |" >>"$report"
    rc=1
  fi
  python3 "$client" leaks "$base" "$data" "$work/watched.json" >>"$report" || rc=1
  summary=$(python3 -c 'import json, sys
print("%(creates)d creates, %(execs)d executions, %(uploads)d uploads acknowledged; lost %(lost)d"
      % json.load(open(sys.argv[1])))' "$work/acks/summary.json" 2>/dev/null || echo "no summary")
  echo "| kill -9 under load: $clients clients, $kills kills | summary | $summary; back to serving after: ${recovery}; client-side errors: $(cat "$work/load-errors.json") |" >>"$report"
fi

if [[ $what == slow || $what == all ]]; then
  say "slow: $idle idle connections, a slow-loris head and a slow body past --max-connections 8"
  data=$work/slow
  new_data_dir "$data"
  start_server "$data" "$work/slow.log" "" --max-connections 8 --header-timeout 2 \
    --keep-alive-timeout 2 --body-timeout 2 --body-min-rate 1024 || die "serve did not start"
  python3 "$client" slow "$base" "$server_pid" 2 "$idle" >>"$report" || rc=1
  stop_server
fi

mkdir -p bench/results
out=bench/results/faults-$(date -u +%Y%m%dT%H%M%SZ).md
cp "$report" "$out"
cat "$report"
say "report: $out"
exit "$rc"
