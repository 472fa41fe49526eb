#!/usr/bin/env bash
# Workspaces on disk against workspaces in memory, one binary, in one run (issue 17): each round
# starts a fresh `runcell serve` per variant, in turn (so the shared machine's swings hit both),
# and measures over HTTP
#   - 10 x 10 accumulating `POST /v1/sessions` (then deleted), default server (zygote, 2 warm
#     sessions);
#   - the same on `--warm-sessions 0` (every create forks; the workspace is made on the way);
#   - 300 `1+1` round trips on one session (the sync before each reply);
#   - 100 cells that write a 4 KiB file, and 100 uploads (PUT) of 4 KiB.
# Variants: `disk` (the default) and `memory` (`--workspaces-in-memory`, the tmpfs of before).
#
# Usage: bench/workspaces.sh [BINARY]     (root; ROUNDS=2 by default; BINARY defaults to
# target/debug/runcell). The Python runtime comes from RUNCELL_BENCH_DATA (default
# /var/tmp/runcell-bench; install it with `runcell runtime install --data-dir ...`).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/debug/runcell}")
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
[[ -d $cache/runtimes ]] || "$bin" runtime install --data-dir "$cache" >/dev/null
rounds=${ROUNDS:-2}
run() { # run VARIANT WARM
  local variant=$1 warm=$2 extra=()
  [[ $variant == memory ]] && extra+=(--workspaces-in-memory)
  data=$(mktemp -d /var/tmp/rc-ws.XXXXXX); ln -s "$(realpath "$cache")/runtimes" "$data/runtimes"
  port=$((20000 + RANDOM % 40000))
  RUST_LOG=warn "$bin" serve --listen "127.0.0.1:$port" --data-dir "$data" --warm-sessions "$warm" \
    "${extra[@]}" >/dev/null 2>"$data.log" </dev/null &
  pid=$!
  trap 'kill -TERM $pid 2>/dev/null || true' EXIT
  for _ in $(seq 1200); do
    h=$(curl -sf "http://127.0.0.1:$port/healthz" || true)
    [[ $h == *'"state":"ready"'* && ( $warm == 0 || $h == *"\"warm_sessions\":$warm"* ) ]] && break
    sleep 0.1
  done
  sleep 1 # spare workspaces: let the filler finish its first round
  python3 - "$port" "$variant" "$warm" <<'PY'
import http.client, json, sys, time, statistics
port = int(sys.argv[1]); c = http.client.HTTPConnection("127.0.0.1", port)
def call(m, p, b=None, raw=None):
    t = time.perf_counter()
    body = raw if raw is not None else (json.dumps(b) if b is not None else None)
    c.request(m, p, body=body, headers={"content-type": "application/json"})
    r = c.getresponse(); d = r.read()
    return (time.perf_counter() - t) * 1e3, (json.loads(d) if d and r.status != 204 else None)
def q(xs):
    xs = sorted(xs); return "p50 %6.2f p95 %6.2f" % (statistics.median(xs), xs[int(len(xs) * .95)])
ts = []
# 10 batches of 10 accumulating creates (100 at once would pass the memory budget: 1 GiB each).
for _ in range(10):
    ids = []
    for _ in range(10):
        ms, s = call("POST", "/v1/sessions", {}); ts.append(ms); ids.append(s["id"])
    for i in ids:
        call("DELETE", f"/v1/sessions/{i}")
    # Deleted workspaces are unmounted and removed off the request path: let that settle, so
    # the next batch measures creates, not the last batch's teardown.
    time.sleep(1.5)
line = "%-6s warm=%s create %s" % (sys.argv[2], sys.argv[3], q(ts))
if sys.argv[3] != "0":
    _, s = call("POST", "/v1/sessions", {}); sid = s["id"]
    call("POST", f"/v1/sessions/{sid}/execute", {"code": "1"})
    one = [call("POST", f"/v1/sessions/{sid}/execute", {"code": "1+1"})[0] for _ in range(300)]
    w = [call("POST", f"/v1/sessions/{sid}/execute", {"code": f"open('f{i}.txt', 'w').write('x' * 4096)"})[0] for i in range(100)]
    up = [call("PUT", f"/v1/sessions/{sid}/files/u{i}.bin", raw=b"y" * 4096)[0] for i in range(100)]
    line += " | 1+1 %s | cell writing 4 KiB %s | upload 4 KiB %s" % (q(one), q(w), q(up))
print(line, flush=True)
PY
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  awk -v w="$data/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$data" "$data.log"
}
for r in $(seq "$rounds"); do
  for warm in 2 0; do
    for v in disk memory; do run "$v" "$warm"; done
  done
done
