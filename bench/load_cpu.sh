#!/usr/bin/env bash
# Where a trivial execution's CPU goes: the pinned HTTP load of bench/load.sh (`1+1` on 16
# sessions, 2 keep-alive clients each, wrk), against a fresh server of each binary in turn,
# with the CPU per request of the server process, of the session kernels and of the whole
# machine (from /proc), and context switches per request.
#
# Usage: bench/load_cpu.sh BINARY [BINARY ...]     (root; ROUNDS=3, SECONDS_PER_RUN=15)
# The binaries alternate within each round: on this shared machine, compare only within a round.
# The Python runtime comes from RUNCELL_BENCH_DATA (default /var/tmp/runcell-bench; install it
# with `runcell runtime install --data-dir /var/tmp/runcell-bench`). Needs wrk, curl, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
(( $# >= 1 )) || { echo "usage: bench/load_cpu.sh BINARY [BINARY ...]" >&2; exit 2; }
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
[[ -d $cache/runtimes ]] || { echo "no runtime in $cache: runcell runtime install --data-dir $cache" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is required (apt-get install wrk)" >&2; exit 1; }
rounds=${ROUNDS:-3}
seconds=${SECONDS_PER_RUN:-15}
sessions=16
hz=$(getconf CLK_TCK)

server_pid='' data=''
cleanup() {
  if [[ -n $server_pid ]]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  if [[ -n $data ]]; then rm -rf -- "$data"; fi
  server_pid='' data=''
}
trap cleanup EXIT

# CPU ticks (user + system) of the given pids.
ticks() { local t=0 p f; for p in "$@"; do read -r -a f <"/proc/$p/stat"; t=$((t + f[13] + f[14])); done; echo "$t"; }
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
switches() { awk '/^ctxt/ {print $2}' /proc/stat; }
json_field() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }

echo "| round | binary | req/s | server CPU / request | kernels CPU / request | machine CPU / request | context switches / request |"
echo "|:--|:--|--:|--:|--:|--:|--:|"
for r in $(seq "$rounds"); do
  for bin in "$@"; do
    data=$(mktemp -d /var/tmp/runcell-load-cpu.XXXXXX)
    ln -s "$(realpath "$cache")/runtimes" "$data/runtimes"
    port=$((20000 + RANDOM % 40000))
    base=http://127.0.0.1:$port
    # No warm sessions: the kernels measured are exactly the load's.
    RUST_LOG=warn "$bin" serve --listen "127.0.0.1:$port" --data-dir "$data" --warm-sessions 0 \
      >/dev/null 2>"$data/serve.log" </dev/null &
    server_pid=$!
    for _ in $(seq 1200); do
      [[ $(curl -sf "$base/healthz" || true) == *'"state":"ready"'* ]] && break
      sleep 0.1
    done
    ids=()
    for _ in $(seq "$sessions"); do
      ids+=("$(curl -sf -X POST -H 'Content-Type: application/json' -d '{}' "$base/v1/sessions" | json_field '["id"]')")
    done
    # The kernels: the zygote's children are the sessions' pid 1s, whose child is the kernel.
    zygote=$(curl -sf "$base/healthz" | json_field '["zygote"]["pid"]')
    kernels=()
    read -r -a pid1s <<<"$(cat /proc/"$zygote"/task/*/children)"
    for p1 in "${pid1s[@]}"; do
      read -r -a kernel <<<"$(cat /proc/"$p1"/task/*/children)"
      kernels+=("${kernel[@]}")
    done
    (( ${#kernels[@]} == sessions )) || { echo "found ${#kernels[@]} kernels, expected $sessions" >&2; exit 1; }
    k0=$(ticks "${kernels[@]}") s0=$(ticks "$server_pid") m0=$(machine_ticks) x0=$(switches)
    wrk -t "$sessions" -c $((2 * sessions)) -d "${seconds}s" --timeout 60s -s bench/load/execute.lua \
      "$base" -- pinned "${ids[@]}" >"$data/wrk.out" 2>&1
    k1=$(ticks "${kernels[@]}") s1=$(ticks "$server_pid") m1=$(machine_ticks) x1=$(switches)
    n=$(awk '$1 == "@@" && $2 == "requests" {print $3}' "$data/wrk.out")
    [[ -n $n && $n -gt 0 ]] || { cat "$data/wrk.out" >&2; exit 1; }
    awk -v r="$r" -v b="$(basename "$bin")" -v n="$n" -v s="$seconds" -v hz="$hz" \
      -v sv=$((s1 - s0)) -v k=$((k1 - k0)) -v m=$((m1 - m0)) -v x=$((x1 - x0)) 'BEGIN {
        us = 1e6 / hz / n
        printf "| %s | %s | %.0f | %.0f µs | %.0f µs | %.0f µs | %.1f |\n", r, b, n / s, sv * us, k * us, m * us, x / n
      }'
    cleanup
  done
done
