#!/usr/bin/env bash
# One-shot runs, side by side in one run (ratios matter on this shared, noisy machine, not
# absolutes):
#   1. the CLI: `runcell run FILE` of print(1) against a bare `python3 -c`, a bare `python3
#      FILE` and bubblewrap with comparable namespaces: without a server (a cold sandbox) and
#      with a `runcell serve` on its data dir (which runs it forked from its zygote);
#   2. the API of a fresh `runcell serve` (zygote preloading numpy, pandas, matplotlib):
#      POST /v1/execute of print(1) and of a numpy + pandas program, forked from the zygote and
#      `"start": "cold"`, p50/p95/p99 as an HTTP client sees them; POST /v1/batch of N print(1)
#      runs at concurrency 2, 4 and 8 (runs/s); every run in its own sandbox, and the audit log
#      checked to hold every one (bench/oneshots.py).
# Usage: bench/oneshot.sh [--cli-only] [CLI_RUNS=60] [BATCH_RUNS=2000]
#   (root; apt-get install hyperfine bubblewrap). RUNCELL_BIN: a runcell binary (default: cargo
#   build --release); RUNCELL_BASE_BIN: a second one timed beside it in the same hyperfine run
#   (e.g. main's, to compare a branch); RUNCELL_BENCH_DATA: the runtime cache (default
#   /var/tmp/runcell-bench). --cli-only: the CLI part alone, plus its phases
#   (bench/oneshot_phases.py, from the scheduler's tracepoints).
set -euo pipefail
cd "$(dirname "$0")/.."
cli_only=
if [[ ${1:-} == --cli-only ]]; then cli_only=1; shift; fi
runs=${1:-60}
batch=${2:-2000}
say() { printf '[oneshot] %s\n' "$*" >&2; }
if [[ -n ${RUNCELL_BIN:-} ]]; then bin=$RUNCELL_BIN; else
  say "building runcell (release)"; cargo build --release -q -p runcell
  bin=${CARGO_TARGET_DIR:-target}/release/runcell
fi
bin=$(realpath "$bin")
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
mkdir -p "$cache"
"$bin" runtime install --data-dir "$cache" >/dev/null 2>"$cache/install.log" ||
  { tail -20 "$cache/install.log" >&2; exit 1; }

work=$(mktemp -d /var/tmp/runcell-oneshot.XXXXXX)
server_pid=
served_pid=
cleanup() {
  local rc=$?
  for p in $server_pid $served_pid; do
    if kill -0 "$p" 2>/dev/null; then kill -TERM "$p"; wait "$p" 2>/dev/null || true; fi
  done
  (( rc == 0 )) && rm -rf -- "$work" || say "kept $work"
  exit "$rc"
}
trap cleanup EXIT
stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p bench/results
out=bench/results/oneshot-$stamp

prog=$work/print1.py
echo 'print(1)' >"$prog"
cli=$work/cli
mkdir -p "$cli"; ln -s "$(realpath "$cache")/runtimes" "$cli/runtimes"
# The interpreter `runcell run` starts: the runtime's python3 (a venv over the system's
# python3.11, with its site-packages and .pth files). Bare, it is the fair baseline.
runtime_py=$(ls -d "$(realpath "$cache")"/runtimes/python-*/bin/python3 | head -1)
base=()
if [[ -n ${RUNCELL_BASE_BIN:-} ]]; then
  base=(-n 'runcell run FILE (cold, base)' "$(realpath "$RUNCELL_BASE_BIN") run $prog")
fi
# `runcell run` with a `runcell serve` on its data dir hands the run to the server (forked
# from its zygote, crates/cli/src/local.rs): timed beside the cold one, on a server of its own.
served=$work/served
mkdir -p "$served"; ln -s "$(realpath "$cache")/runtimes" "$served/runtimes"
served_port=$((20000 + RANDOM % 40000))
RUST_LOG=warn "$bin" serve --listen "127.0.0.1:$served_port" --data-dir "$served" \
  --warm-sessions 0 >"$work/served.out" 2>"$work/served.log" </dev/null &
served_pid=$!
for _ in $(seq 1200); do
  h=$(curl -sf "http://127.0.0.1:$served_port/healthz" || true)
  [[ $h == *'"state":"ready"'* && $h == *'"warm_one_shots":'[1-9]* ]] && break
  kill -0 "$served_pid" 2>/dev/null || { tail "$work/served.log" >&2; exit 1; }
  sleep 0.1
done
say "CLI: hyperfine, $runs runs each"
RUNCELL_DATA_DIR=$cli hyperfine -N --warmup 5 --runs "$runs" --export-markdown "$out-cli.md" \
  -n 'python3 -c print(1)' '/usr/bin/python3 -c print(1)' \
  -n 'python3 FILE' "/usr/bin/python3 $prog" \
  -n 'runtime python3 FILE (bare)' "$runtime_py $prog" \
  -n 'bwrap (user,pid,net,ipc,uts,cgroup ns; ro /usr)' \
     "bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin --proc /proc --dev /dev --tmpfs /tmp --ro-bind $prog /p.py /usr/bin/python3 /p.py" \
  -n 'runcell run FILE (cold)' "$bin run $prog" "${base[@]}" \
  -n 'runcell run FILE (a runcell serve on its data dir)' "$bin --data-dir $served run $prog" >/dev/null
kill -TERM "$served_pid"; wait "$served_pid" 2>/dev/null || true
if [[ -n $cli_only ]]; then
  say "CLI phases: bench/oneshot_phases.py, $runs runs each"
  phase_bins=("$bin")
  [[ -n ${RUNCELL_BASE_BIN:-} ]] && phase_bins+=("$(realpath "$RUNCELL_BASE_BIN")")
  RUNCELL_DATA_DIR=$cli /usr/bin/python3 bench/oneshot_phases.py "$runs" "$prog" "$runtime_py" \
    "${phase_bins[@]}" >"$out-phases.md"
  { echo "CLI (hyperfine; \`runcell run\` has no server, so no zygote), $(uptime):"; echo
    cat "$out-cli.md"; echo; echo "Phases (bench/oneshot_phases.py):"; echo
    cat "$out-phases.md"; } | tee "$out.md"
  say "results: $out.md"
  exit 0
fi

say "API: a fresh server with the zygote"
data=$work/server
mkdir -p "$data"; ln -s "$(realpath "$cache")/runtimes" "$data/runtimes"
port=$((20000 + RANDOM % 40000))
base=http://127.0.0.1:$port
RUST_LOG=warn "$bin" serve --listen "127.0.0.1:$port" --data-dir "$data" --warm-sessions 0 \
  >"$work/server.out" 2>"$work/server.log" </dev/null &
server_pid=$!
for _ in $(seq 1200); do
  h=$(curl -sf "$base/healthz" || true)
  [[ $h == *'"state":"ready"'* ]] && break
  [[ $h == *'"state":"failed"'* ]] && { say "zygote failed: $h"; exit 1; }
  kill -0 "$server_pid" 2>/dev/null || { tail "$work/server.log" >&2; exit 1; }
  sleep 0.1
done
[[ $h == *'"state":"ready"'* ]] || { say "zygote not ready after 120 s"; exit 1; }
/usr/bin/python3 bench/oneshots.py "$base" "$out-api.json" --batch "$batch" >/dev/null

/usr/bin/python3 - "$out-cli.md" "$out-api.json" "$out.md" <<'EOF'
import json, sys
cli, api, out = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), sys.argv[3]
L = ["CLI (hyperfine; `runcell run` has no server, so no zygote):", "", cli.strip(), "",
     "API (`POST /v1/execute`, one keep-alive connection, ms as the client sees them; "
     "server = the Execution's `wall_ms`):", "",
     "| ms | p50 | p95 | p99 | min | server p50 |", "|:--|--:|--:|--:|--:|--:|"]
for k, label in [("execute_print_zygote", "`print(1)`, zygote"),
                 ("execute_pandas_zygote", "numpy + pandas, zygote"),
                 ("execute_print_paced", "`print(1)`, zygote, 20 ms apart"),
                 ("execute_pandas_paced", "numpy + pandas, zygote, 20 ms apart"),
                 ("execute_print_cold", "`print(1)`, `start: cold`"),
                 ("execute_pandas_cold", "numpy + pandas, `start: cold`")]:
    c, s = api[k]["client"], api[k]["server_wall"]
    L.append(f"| {label} (n={c['n']}) | {c['p50']} | {c['p95']} | {c['p99']} | {c['min']} | {s['p50']} |")
L += ["", "| `POST /v1/batch` of `print(1)` | runs | s | runs/s |", "|:--|--:|--:|--:|"]
for b in api["batches"]:
    L.append(f"| concurrency {b['concurrency']} | {b['runs']} | {b['seconds']} | **{b['runs_per_s']}** |")
a = api["audited"]
L += ["", f"Audit log: {a['recorded']} executions recorded for {a['expected']} runs."]
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
say "results: $out.md"
