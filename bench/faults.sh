#!/usr/bin/env bash
# Fault runs of `runcell serve`, on demand (as root): a data dir whose disk fills up, and
# big workspaces (multipart uploads of many parts, a workspace of many files).
#
# Usage: bench/faults.sh [disk|uploads|files|all=all]
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
# Prints a markdown report and writes it to bench/results/faults-<timestamp>.md; exits
# non-zero on any check that fails. (Kill -9 under load is `bench/load.sh` with kill -9s; the
# slow-client run is not here yet.)
#
# Environment:
#   RUNCELL_BIN          a runcell binary (default: cargo build --release -p runcell)
#   RUNCELL_BENCH_DATA   cache for the Python runtime (default /var/tmp/runcell-bench)
#   RUNCELL_BENCH_KEEP=1 keep the run's directory and server logs
# Needs python3 (the HTTP client is its standard library) and curl.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
case $what in disk|uploads|files|all) ;; *) echo "usage: bench/faults.sh [disk|uploads|files|all]" >&2; exit 2 ;; esac

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

# start_server DATA LOG: serves DATA on a free port; sets $base. Waits for its "serving" line.
start_server() {
  local data=$1 log=$2 port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  NO_COLOR=1 RUNCELL_DATA_DIR=$data "$bin" serve --listen "127.0.0.1:$port" \
    --warm-sessions 0 >"$log" 2>&1 &
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

mkdir -p bench/results
out=bench/results/faults-$(date -u +%Y%m%dT%H%M%SZ).md
cp "$report" "$out"
cat "$report"
say "report: $out"
exit "$rc"
