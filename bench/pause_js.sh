#!/usr/bin/env bash
# Pause and resume of JavaScript sessions (issue 17) through the HTTP API, side by side in one
# run: a session that holds nothing and one that holds 10 MB (a Float64Array of 1.25 M numbers
# and a Map of 1,000 objects), paused and resumed alternately N times each.
#
# Usage: bench/pause_js.sh [BINARY=target/debug/runcell] [N=7]
#   RUNTIMES  installed runtimes linked into the bench's data dir (default: what the tests
#             install, target/tmp/runcell-test-runtimes/runtimes), so no install is timed
# Prints each session's pause and resume (POST .../resume, to its reply) p50 and max, in ms,
# and the snapshot's size. Compare within a run: a shared machine's absolute numbers move.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/target/debug/runcell}
n=${2:-7}
runtimes=${RUNTIMES:-$root/target/tmp/runcell-test-runtimes/runtimes}
data=$(mktemp -d "${TMPDIR:-/tmp}/runcell-bench-pause-js-XXXXXX")
[ -d "$runtimes" ] && ln -s "$runtimes" "$data/runtimes"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
RUNCELL_DATA_DIR=$data NO_COLOR=1 "$bin" serve --listen 127.0.0.1:$port --warm-sessions 0 >"$data/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 300); do grep -q "serving on" "$data/serve.log" && break; sleep 1; done
B=http://127.0.0.1:$port
js() { curl -s -X POST $B/v1/sessions -H 'content-type: application/json' -d '{"language":"javascript"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }
run() { curl -s -o /dev/null -X POST "$B/v1/sessions/$1/execute" -H 'content-type: application/json' -d "{\"code\": \"$2\"}"; }
empty=$(js); run "$empty" "1"
big=$(js); run "$big" "const samples = new Float64Array(1.25e6).fill(0.5); const m = new Map(Array.from({length: 1000}, (_, i) => [i, {i}]))"
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
for _ in $(seq "$n"); do
  for s in empty big; do
    id=${!s}
    t=$(date +%s%N); curl -s -o /dev/null -X POST "$B/v1/sessions/$id/pause"; p=$(ms "$t")
    t=$(date +%s%N); curl -s -o /dev/null -X POST "$B/v1/sessions/$id/resume"; r=$(ms "$t")
    echo "$s $p $r"
  done
done | python3 -c '
import statistics, sys
rows = {}
for line in sys.stdin:
    s, p, r = line.split()
    rows.setdefault(s, []).append((int(p), int(r)))
for s, v in rows.items():
    ps, rs = [p for p, _ in v], [r for _, r in v]
    print(f"{s:6} pause p50 {statistics.median(ps):5.0f} ms (max {max(ps)})  resume p50 {statistics.median(rs):5.0f} ms (max {max(rs)})")
'
curl -s -o /dev/null -X POST "$B/v1/sessions/$big/pause"
echo "snapshot of the 10 MB session: $(stat -c %s "$data/snapshots/$big.snap") bytes"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
