#!/usr/bin/env bash
# Session start-up, first-cell, `1+1` and density benchmarks through the HTTP API (issue 5),
# with the zygote and without it (cold), and a Jupyter kernel side by side, in one run.
#
# Usage: bench/sessions.sh [DENSITY_SESSIONS=500]      (as root)
#
#   1. a fresh `runcell serve` (zygote preloading numpy, pandas, matplotlib; 2 warm sessions, the
#      default), once both are ready: 100 sequential
#      `POST /v1/sessions`; 30 x (create + a cell importing numpy, pandas, matplotlib.pyplot);
#      1000 sequential `1+1` on one session; then DENSITY_SESSIONS live sessions that each ran
#      a pandas + matplotlib cell (MemAvailable drop / sessions, then `1+1` on the first and last);
#   2. the same (without density) on a server with --warm-sessions 0 (every create forks from
#      the zygote) and on one started with --no-zygote (every session starts cold);
#   3. Jupyter: jupyter_client starting ipykernel and running the same imports (10 times), and
#      1000 `1+1` round trips, in a bench-only venv (created with pip on the first run).
# Writes bench/results/sessions-<timestamp>.md (and .json). Ratios from the same run matter on
# this shared machine, not absolute numbers across runs.
#
# Environment: RUNCELL_BIN (a runcell binary; default cargo build --release), RUNCELL_BENCH_DATA
# (runtime + Jupyter venv cache, default /var/tmp/runcell-bench), NO_JUPYTER=1 to skip step 3.
set -euo pipefail
cd "$(dirname "$0")/.."
density=${1:-500}
[[ $density =~ ^[0-9]+$ ]] || { echo "usage: bench/sessions.sh [DENSITY_SESSIONS]" >&2; exit 2; }
say() { printf '[sessions] %s\n' "$*" >&2; }

if [[ -n ${RUNCELL_BIN:-} ]]; then bin=$RUNCELL_BIN; else
  say "building runcell (release)"; cargo build --release -q -p runcell
  bin=${CARGO_TARGET_DIR:-target}/release/runcell
fi
bin=$(realpath "$bin")
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
mkdir -p "$cache"
"$bin" runtime install --data-dir "$cache" >/dev/null 2>"$cache/install.log" ||
  { tail -20 "$cache/install.log" >&2; exit 1; }

jupyter_py=
if [[ ${NO_JUPYTER:-0} != 1 ]]; then
  venv=$cache/jupyter-venv
  if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import jupyter_client, ipykernel, pandas, matplotlib' 2>/dev/null; then
    say "creating the Jupyter venv in $venv (first run only)"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q jupyter_client ipykernel numpy pandas matplotlib
  fi
  jupyter_py=$venv/bin/python
fi

work=$(mktemp -d /var/tmp/runcell-sessions.XXXXXX)
server_pid=
stop_server() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=
}
cleanup() {
  local rc=$?
  stop_server
  awk -v w="$work/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  (( rc == 0 )) && rm -rf -- "$work" || say "kept $work"
  exit "$rc"
}
trap cleanup EXIT

# start_server NAME ARGS...: a fresh data dir sharing the cached runtime; waits for /healthz and,
# with a zygote, for it to be ready.
start_server() {
  local name=$1; shift
  local data=$work/$name
  mkdir -p "$data"; ln -s "$(realpath "$cache")/runtimes" "$data/runtimes"
  port=$((20000 + RANDOM % 40000))
  base=http://127.0.0.1:$port
  RUST_LOG=warn "$bin" serve --listen "127.0.0.1:$port" --data-dir "$data" "$@" \
    >"$work/$name.out" 2>"$work/$name.log" </dev/null &
  server_pid=$!
  for _ in $(seq 1200); do
    h=$(curl -sf "$base/healthz" || true)
    # The default server also fills its warm sessions once the zygote is ready.
    if [[ $h == *'"state":"off"'* || ( $h == *'"state":"ready"'* &&
          ( " $* " == *" --warm-sessions 0 "* || $h == *'"warm_sessions":2'* ) ) ]]; then
      return 0
    fi
    [[ $h == *'"state":"failed"'* ]] && { say "zygote failed: $h"; exit 1; }
    kill -0 "$server_pid" 2>/dev/null || { tail "$work/$name.log" >&2; exit 1; }
    sleep 0.1
  done
  say "server not ready after 120 s"; exit 1
}

stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p bench/results
say "zygote server"
start_server zygote
/usr/bin/python3 bench/sessions.py "$base" zygote "$work/zygote.json" --density "$density" \
  ${jupyter_py:+--jupyter "$jupyter_py"} >/dev/null
stop_server
say "zygote server without warm sessions (--warm-sessions 0): every create forks"
start_server forked --warm-sessions 0
/usr/bin/python3 bench/sessions.py "$base" forked "$work/forked.json" >/dev/null
stop_server
say "cold server (--no-zygote)"
start_server cold --no-zygote
/usr/bin/python3 bench/sessions.py "$base" cold "$work/cold.json" >/dev/null
stop_server

out=bench/results/sessions-$stamp
/usr/bin/python3 - "$work/zygote.json" "$work/forked.json" "$work/cold.json" "$out" <<'EOF'
import json, sys
z, f, c = (json.load(open(p)) for p in sys.argv[1:4])
out = sys.argv[4]
json.dump({"zygote": z, "forked": f, "cold": c}, open(out + ".json", "w"), indent=2)
rows = [("POST /v1/sessions", "create"), ("create + imports cell", "create_plus_imports"),
        ("`1+1` round trip", "one_plus_one")]
L = ["Columns: the default server (zygote + 2 warm sessions); the zygote with `--warm-sessions 0`"
     " (every create forks); `--no-zygote` (every session starts cold).", "",
     "| ms | default p50 | p95 | p99 | forked p50 | p95 | p99 | cold p50 | p95 | p99 |",
     "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
for label, k in rows:
    a, m, b = z["runcell"][k], f["runcell"][k], c["runcell"][k]
    L.append(f"| {label} | {a['p50']} | {a['p95']} | {a['p99']} | {m['p50']} | {m['p95']} | {m['p99']}"
             f" | {b['p50']} | {b['p95']} | {b['p99']} |")
d = z["runcell"].get("density")
if d:
    L += ["", f"Density: {d['sessions']} live sessions after a pandas + matplotlib cell each: "
          f"MemAvailable dropped {d['mem_available_drop_mib']} MiB = **{d['mib_per_session']} MiB per session** "
          f"(filled in {d['seconds_to_fill']} s); `1+1` afterwards on the first/last: {d['one_plus_one_ms_after']} ms."]
j = z.get("jupyter")
if j:
    zs, js = z["runcell"]["create_plus_imports"]["p50"], j["start_plus_imports"]["p50"]
    zo, jo = z["runcell"]["one_plus_one"]["p50"], j["one_plus_one"]["p50"]
    L += ["", "| p50 ms | runcell (zygote, over HTTP) | Jupyter (jupyter_client + ipykernel, local ZMQ) | ratio |",
          "|:--|--:|--:|--:|",
          f"| start + import numpy, pandas, matplotlib.pyplot | {zs} | {js} | {js / zs:.1f}x faster |",
          f"| `1+1` round trip | {zo} | {jo} | {jo / zo:.1f}x |"]
open(out + ".md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
say "results: $out.md"
