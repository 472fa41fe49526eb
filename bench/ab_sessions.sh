#!/usr/bin/env bash
# Session start, binary against binary: each round starts a fresh `runcell serve` per binary (in
# turn, so that the shared machine's speed swings hit all of them alike) and measures over HTTP
# 100 accumulating `POST /v1/sessions` and 20 x create + `import numpy, pandas, matplotlib.pyplot`.
#
# Usage: bench/ab_sessions.sh BINARY [BINARY ...]     (root; ROUNDS=3 by default)
# The Python runtime comes from RUNCELL_BENCH_DATA (default /var/tmp/runcell-bench; install it
# first with `runcell runtime install --data-dir /var/tmp/runcell-bench`). Needs curl, python3.
set -euo pipefail
(( $# >= 1 )) || { echo "usage: bench/ab_sessions.sh BINARY [BINARY ...]" >&2; exit 2; }
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
[[ -d $cache/runtimes ]] || { echo "no runtime in $cache: runcell runtime install --data-dir $cache" >&2; exit 1; }
rounds=${ROUNDS:-3}
for r in $(seq "$rounds"); do
 for b in "$@"; do
  data=$(mktemp -d /var/tmp/rc-ab.XXXXXX); ln -s "$(realpath "$cache")/runtimes" "$data/runtimes"
  port=$((20000 + RANDOM % 40000))
  RUST_LOG=warn "$b" serve --listen "127.0.0.1:$port" --data-dir "$data" >/dev/null 2>"$data.log" </dev/null &
  pid=$!
  for _ in $(seq 1200); do
    h=$(curl -sf "http://127.0.0.1:$port/healthz" || true)
    [[ $h == *'"state":"ready"'* ]] && break
    sleep 0.1
  done
  python3 - "$port" "$b" <<'PY'
import http.client, json, sys, time, statistics
port = int(sys.argv[1]); c = http.client.HTTPConnection("127.0.0.1", port)
def call(m, p, b=None):
    t = time.perf_counter()
    c.request(m, p, body=json.dumps(b) if b is not None else None, headers={"content-type": "application/json"})
    r = c.getresponse(); d = r.read()
    return (time.perf_counter() - t) * 1e3, (json.loads(d) if d else None)
for _ in range(3):
    _, s = call("POST", "/v1/sessions", {}); call("POST", f"/v1/sessions/{s['id']}/execute", {"code": "1"}); call("DELETE", f"/v1/sessions/{s['id']}")
ts, ids = [], []
for _ in range(100):
    ms, s = call("POST", "/v1/sessions", {}); ts.append(ms); ids.append(s["id"])
for i in ids:
    call("DELETE", f"/v1/sessions/{i}")
ci = []
for _ in range(20):
    t = time.perf_counter(); _, s = call("POST", "/v1/sessions", {})
    call("POST", f"/v1/sessions/{s['id']}/execute", {"code": "import numpy, pandas, matplotlib.pyplot"})
    ci.append((time.perf_counter() - t) * 1e3); call("DELETE", f"/v1/sessions/{s['id']}")
ts.sort(); ci.sort()
print("%-30s create p50 %6.2f p95 %6.2f p99 %6.2f | create+imports p50 %6.2f" % (sys.argv[2][-30:], statistics.median(ts), ts[94], ts[98], statistics.median(ci)))
PY
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  awk -v w="$data/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$data" "$data.log"
 done
done
