#!/usr/bin/env bash
# One-shot overhead: `runcell run` of print(1) against a bare `python3 -c` and against bubblewrap
# with comparable namespaces. Ratios matter (this is a shared, noisy machine), not absolutes.
# Usage: bench/oneshot.sh [RUNS]   (needs root, hyperfine and bwrap: apt-get install hyperfine bubblewrap)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-50}
cargo build --release -q
export RUNCELL_DATA_DIR=${RUNCELL_DATA_DIR:-$(mktemp -d)}
prog=$(mktemp --suffix=.py)
echo 'print(1)' >"$prog"
out=bench/results/oneshot-$(date +%Y%m%d-%H%M%S).md
mkdir -p bench/results
hyperfine -N --warmup 5 --runs "$runs" --export-markdown "$out" \
  -n 'python3 -c print(1)' '/usr/bin/python3 -c print(1)' \
  -n 'bwrap (user,pid,net,ipc,uts,cgroup ns; ro /usr)' \
     'bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin --proc /proc --dev /dev --tmpfs /tmp /usr/bin/python3 -c print(1)' \
  -n 'runcell run' "./target/release/runcell run $prog"
rm -f "$prog"
echo "results: $out"
cat "$out"
