#!/usr/bin/env bash
# What the host's mount table costs a one-shot: `POST /v1/batch` of print(1) runs with the host's
# own mounts, then with N more tmpfs mounts in the host's mount namespace (standing in for N live
# sessions' workspaces, which are exactly that: one mount each), alternated, for each binary
# given (e.g. main's and a branch's), every run in its own fresh sandbox (bench/oneshot_cpu.py).
#
#   [ROUNDS=2] bench/host_mounts.sh N RUNS CONCURRENCY BIN [BIN...]   (e.g. 500 400 4)
#
# CODE and BENCH_RUN pass to bench/oneshot_cpu.py: CODE='echo 1' BENCH_RUN='{"language": "bash"}'
# measures cold one-shots (an exec'd helper each) instead of the zygote's.
#
# Needs root (mounts). The runtime is installed once into RUNCELL_BENCH_DATA
# (/var/tmp/runcell-bench); each server gets a data dir of its own that links to it.
set -euo pipefail
n=${1:-500}; runs=${2:-400}; conc=${3:-4}; shift 3
here=$(cd "$(dirname "$0")" && pwd)
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
mkdir -p "$cache"
"$1" runtime install --data-dir "$cache" >/dev/null 2>"$cache/install.log" ||
  { tail -20 "$cache/install.log" >&2; exit 1; }
work=$(mktemp -d /var/tmp/runcell-mounts.XXXXXX)
fake=$work/fake
pid=
cleanup() {
  [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  for d in "$fake"/*; do umount -l "$d" 2>/dev/null || true; done
}
trap cleanup EXIT
mounts() { # up | down
  mkdir -p "$fake"
  for i in $(seq 1 "$n"); do
    if [[ $1 == up ]]; then mkdir -p "$fake/$i"; mount -t tmpfs -o size=1m fake "$fake/$i"
    else umount "$fake/$i"; fi
  done
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for bin in "$@"; do
    data=$work/data-$round-$(basename "$bin"); mkdir -p "$data"
    ln -s "$(realpath "$cache")/runtimes" "$data/runtimes"
    port=$((20000 + RANDOM % 40000))
    RUST_LOG=warn "$bin" serve --listen "127.0.0.1:$port" --data-dir "$data" --warm-sessions 0 \
      >"$data.out" 2>"$data.log" </dev/null &
    pid=$!
    for _ in $(seq 1200); do
      h=$(curl -sf "http://127.0.0.1:$port/healthz" || true)
      [[ $h == *'"state":"ready"'* && $h == *'"warm_one_shots":'[1-9]* ]] && break
      kill -0 "$pid" 2>/dev/null || { tail "$data.log" >&2; exit 1; }
      sleep 0.1
    done
    # Warm-up: the first runs after start pay for the prepared pool's first fill.
    python3 "$here/oneshot_cpu.py" "http://127.0.0.1:$port" "$pid" 100 "$conc" "${CODE:-print(1)}" >/dev/null
    for extra in 0 "$n"; do
      [[ $extra != 0 ]] && mounts up
      host=$(wc -l </proc/self/mountinfo)
      result=$(python3 "$here/oneshot_cpu.py" "http://127.0.0.1:$port" "$pid" "$runs" "$conc" "${CODE:-print(1)}")
      echo "round $round $(basename "$bin") host_mounts=$host $result"
      [[ $extra != 0 ]] && mounts down
    done
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=
  done
done
