#!/usr/bin/env bash
# Density of live sessions that rendered a matplotlib figure (issue 23, item 5): for each
# binary given, a fresh `runcell serve` (zygote preloading the default modules), N sessions
# that each ran a pandas cell rendering a figure to PNG, then MemAvailable's drop / N and the
# sessions' mean cgroup memory (bench/density.py). Binaries run one after the other in the same
# invocation, so that their figures are side by side.
# Usage: bench/density.sh [N=500] ["BINARY [SERVE FLAGS]"...]
#   (root; default binary: cargo build --release). A run whose flags hold --merge-session-pages
#   starts the host's KSM daemon for its duration (DENSITY_KSM_PAGES pages per 20 ms, default
#   5000), measures once it has scanned everything twice, then unmerges and puts the daemon's
#   settings back.
#   RUNCELL_BENCH_DATA: the runtime cache (default /var/tmp/runcell-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-500}
shift || true
say() { printf '[density] %s\n' "$*" >&2; }
bins=("$@")
if (( ${#bins[@]} == 0 )); then
  say "building runcell (release)"; cargo build --release -q -p runcell
  bins=("${CARGO_TARGET_DIR:-target}/release/runcell")
fi
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
mkdir -p "$cache"
read -r -a first <<<"${bins[0]}"
"$(realpath "${first[0]}")" runtime install --data-dir "$cache" >/dev/null 2>"$cache/install.log" ||
  { tail -20 "$cache/install.log" >&2; exit 1; }

work=$(mktemp -d /var/tmp/runcell-density.XXXXXX)
server_pid=
stop_server() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=
}
ksm=/sys/kernel/mm/ksm
ksm_saved=
ksm_restore() {
  [[ -n $ksm_saved ]] || return 0
  echo 2 >"$ksm/run" # unmerge every page, then the settings as they were
  for _ in $(seq 300); do [[ $(cat "$ksm/pages_sharing") == 0 ]] && break; sleep 0.1; done
  local run pages sleep_ms
  read -r run pages sleep_ms <<<"$ksm_saved"
  echo "$pages" >"$ksm/pages_to_scan"; echo "$sleep_ms" >"$ksm/sleep_millisecs"; echo "$run" >"$ksm/run"
  ksm_saved=
}
cleanup() {
  local rc=$?
  stop_server
  ksm_restore
  awk -v w="$work/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  (( rc == 0 )) && rm -rf -- "$work" || say "kept $work"
  exit "$rc"
}
trap cleanup EXIT
stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p bench/results
out=bench/results/density-$stamp

i=0
for entry in "${bins[@]}"; do
  read -r -a words <<<"$entry"
  bin=$(realpath "${words[0]}")
  flags=("${words[@]:1}")
  ksm_wait=0
  if [[ " ${flags[*]} " == *" --merge-session-pages "* ]]; then
    [[ -e $ksm/run ]] || { say "this kernel has no KSM"; exit 1; }
    ksm_saved="$(cat "$ksm/run") $(cat "$ksm/pages_to_scan") $(cat "$ksm/sleep_millisecs")"
    echo "${DENSITY_KSM_PAGES:-5000}" >"$ksm/pages_to_scan"; echo 20 >"$ksm/sleep_millisecs"
    echo 1 >"$ksm/run"
    ksm_wait=1
  fi
  i=$((i + 1))
  data=$work/server-$i
  mkdir -p "$data"; ln -s "$(realpath "$cache")/runtimes" "$data/runtimes"
  port=$((20000 + RANDOM % 40000))
  base=http://127.0.0.1:$port
  say "$bin ${flags[*]}: $n sessions (uptime: $(uptime | sed 's/.*load/load/'))"
  # Sessions reserve their memory limit (1 GiB) against the host by default: a density run
  # is about what they really use, so the bound is lifted. They pause after 300 s idle by
  # default, which a run waiting for KSM outlasts: the wait is for them alive.
  RUST_LOG=warn "$bin" serve --listen "127.0.0.1:$port" --data-dir "$data" \
    --max-committed-memory-mb 1000000 --default-pause-after-s 7200 "${flags[@]}" \
    >"$work/server-$i.out" 2>"$work/server-$i.log" </dev/null &
  server_pid=$!
  h=
  for _ in $(seq 1800); do
    h=$(curl -sf "$base/healthz" || true)
    [[ $h == *'"state":"ready"'* ]] && break
    [[ $h == *'"state":"failed"'* ]] && { say "zygote failed: $h"; exit 1; }
    kill -0 "$server_pid" 2>/dev/null || { tail "$work/server-$i.log" >&2; exit 1; }
    sleep 0.1
  done
  [[ $h == *'"state":"ready"'* ]] || { say "zygote not ready after 180 s"; exit 1; }
  zpid=$(sed 's/.*"pid":\([0-9]*\).*/\1/' <<<"$h")
  huge=$(awk '/AnonHugePages/ {print $2}' "/proc/$zpid/smaps_rollup" 2>/dev/null || echo "?")
  DENSITY_KSM_WAIT=$ksm_wait /usr/bin/python3 bench/density.py "$base" "$n" "$out-$i.json" >/dev/null
  huge_after=$(awk '/AnonHugePages/ {print $2}' "/proc/$zpid/smaps_rollup" 2>/dev/null || echo "?")
  /usr/bin/python3 - "$out-$i.json" "$bin ${flags[*]}" "$huge" "$huge_after" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
r["binary"], r["zygote_anon_huge_kib"] = sys.argv[2].strip(), sys.argv[3]
r["zygote_anon_huge_kib_after"] = sys.argv[4]
json.dump(r, open(sys.argv[1], "w"), indent=2)
print(f"{sys.argv[2]}: {r['sessions']} sessions, MemAvailable -{r['mem_available_drop_mib']} MiB "
      f"= {r['mib_per_session']} MiB/session; cgroup {r['cgroup_mib_per_session']} MiB/session; "
      f"filled in {r['seconds_to_fill']} s; zygote AnonHugePages {sys.argv[3]} -> {sys.argv[4]} KiB"
      + (f"; KSM {r['ksm']}" if "ksm" in r else ""))
EOF
  stop_server
  ksm_restore
done
say "results: $out-*.json"
