#!/usr/bin/env bash
# HTTP load benchmark of `runcell serve`: many clients running `1+1` on a pool of sessions.
#
# Usage: bench/load.sh [CLIENTS=100] [SECONDS=60] [SESSIONS=20]      (as root)
#
# One run, against one fresh server on 127.0.0.1 (free port, fresh data dir and database):
#   1. create-session latency: 50 sequential `POST /v1/sessions {}` (then 50 `DELETE`s);
#   2. round trip of `1+1` on one idle session: 500 sequential `POST .../execute`;
#   3. CLIENTS concurrent keep-alive clients (wrk) for SECONDS doing `POST .../execute
#      {"code":"1+1"}` round-robin over SESSIONS sessions (a session runs one execution at a time
#      with a queue of 8 behind it; past that the server answers 429, counted separately).
#      Round-robin sends every client to a session that stalls, so its queue fills up and 429s
#      appear even though clients/sessions <= 9; RUNCELL_BENCH_MODE=pinned instead gives each
#      session its own wrk thread and CLIENTS/SESSIONS connections (no session ever sees more).
# Prints a markdown report and writes it to bench/results/load-<timestamp>.md. Exits non-zero on
# any 5xx, socket error, timeout, wrong `1+1` result or session not `ready` after the load. This is a shared, noisy machine: compare
# ratios from the same run (load vs. sequential), not absolute numbers across runs.
#
# Environment:
#   RUNCELL_BIN          a runcell binary to use (default: cargo build --release -p runcell;
#                        honours CARGO_TARGET_DIR)
#   RUNCELL_BENCH_DATA   cache for the Python runtime, reused across runs
#                        (default /var/tmp/runcell-bench; the first run installs it, ~30 s)
#   RUNCELL_BENCH_MODE   rr (default: round-robin per request) or pinned (see 3. above)
#   WRK_THREADS          wrk threads in rr mode (default: number of CPUs, at most CLIENTS)
#   RUNCELL_BENCH_KEEP=1 keep the run's data dir and server log
# Needs wrk (installed with apt-get if missing), curl and awk.
set -euo pipefail
cd "$(dirname "$0")/.."

clients=${1:-100}
seconds=${2:-60}
nsessions=${3:-20}
for v in "$clients" "$seconds" "$nsessions"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "usage: bench/load.sh [CLIENTS] [SECONDS] [SESSIONS] (positive integers)" >&2; exit 2; }
done
create_n=50
exec_n=500
mode=${RUNCELL_BENCH_MODE:-rr}
case $mode in
  rr) ;;
  pinned) (( clients % nsessions == 0 )) ||
    { echo "pinned mode needs CLIENTS to be a multiple of SESSIONS" >&2; exit 2; } ;;
  *) echo "RUNCELL_BENCH_MODE must be rr or pinned" >&2; exit 2 ;;
esac

say() { printf '[load] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[[ $EUID -eq 0 ]] || say "warning: not root; the sandbox may lack cgroups or uid ranges"
command -v curl >/dev/null || die "curl is required"
if ! command -v wrk >/dev/null; then
  say "installing wrk (apt-get)"
  apt-get install -y -q wrk >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; } ||
    die "cannot install wrk: apt-get install wrk"
fi

if [[ -n ${RUNCELL_BIN:-} ]]; then
  bin=$RUNCELL_BIN
else
  say "building runcell (release)"
  cargo build --release -q -p runcell
  bin=${CARGO_TARGET_DIR:-target}/release/runcell
fi
[[ -x $bin ]] || die "no runcell binary at $bin"
bin=$(realpath "$bin")

# --- A fresh data dir per run; the Python runtime comes from a cache shared by runs. ---
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
mkdir -p "$cache"
if compgen -G "$cache/runtimes/python-*" >/dev/null; then
  say "runtime cache: $cache"
else
  say "installing the Python runtime into $cache (first run only, ~30 s)"
fi
NO_COLOR=1 "$bin" runtime install --data-dir "$cache" >/dev/null 2>"$cache/install.log" ||
  { tail -20 "$cache/install.log" >&2; die "cannot install the Python runtime"; }
work=$(mktemp -d /var/tmp/runcell-load.XXXXXX)
data=$work/data
mkdir -p "$data"
ln -s "$(realpath "$cache")/runtimes" "$data/runtimes"
log=$work/serve.log

server_pid=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  # The server should have unmounted every session workspace; never leave a mount behind.
  awk -v w="$work/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  if (( rc != 0 )) && [[ -f $log ]]; then
    say "last lines of the server log ($log):"
    tail -20 "$log" >&2 || true
  fi
  if [[ ${RUNCELL_BENCH_KEEP:-0} == 1 || $rc != 0 ]]; then
    say "kept $work"
  else
    rm -rf -- "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- Start the server on a free loopback port. ---
port_in_use() { ss -Htln "sport = :$1" 2>/dev/null | grep -q .; }
for _ in $(seq 50); do
  port=$((20000 + RANDOM % 40000))
  port_in_use "$port" || break
done
base=http://127.0.0.1:$port
say "starting runcell serve on 127.0.0.1:$port (data dir $data)"
NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} "$bin" serve --listen "127.0.0.1:$port" --data-dir "$data" \
  >"$work/serve.out" 2>"$log" </dev/null &
server_pid=$!
for i in $(seq 1200); do
  curl -sf -o /dev/null "$base/healthz" && break
  kill -0 "$server_pid" 2>/dev/null || die "the server exited during start-up"
  (( i < 1200 )) || die "no /healthz after 120 s"
  sleep 0.1
done
say "server up (pid $server_pid)"

json=(-H 'Content-Type: application/json')
# Milliseconds of the curl `time_total` column, p-th percentile (nearest rank) of a file.
pct() { sort -n "$1" | awk -v p="$2" '{v[NR]=$1} END {if (NR==0) {print "n/a"; exit} r=int((p*NR+99)/100); if (r<1) r=1; printf "%.1f", v[r]}'; }
# A session id from a Session object on stdin.
session_id() { grep -o '"id":"[^"]*"' | head -1 | cut -d'"' -f4; }
# Sequential requests over one keep-alive connection: curl config lines on stdin, one
# "<status> <seconds>" line per request on stdout.
curl_seq() { curl -s -K - -w '%{http_code} %{time_total}\n' "$@"; }
# Splits "<status> <seconds>" lines into ms values ($2) and returns the number of non-$3 statuses.
split_times() { awk -v ok="$3" -v out="$2" '{printf "%.3f\n", $2*1000 > out; if ($1!=ok) bad++} END {print bad+0}' "$1"; }

# --- 1. Create-session latency (sequential), then delete them. ---
say "1/3: $create_n sequential session creates"
mkdir -p "$work/created"
for i in $(seq "$create_n"); do
  printf 'url = "%s/v1/sessions"\noutput = "%s/created/%d.json"\n' "$base" "$work" "$i"
done | curl_seq -X POST "${json[@]}" -d '{}' >"$work/create.raw"
create_bad=$(split_times "$work/create.raw" "$work/create.ms" 201)
for i in $(seq "$create_n"); do
  id=$(session_id <"$work/created/$i.json" || true)
  if [[ -n $id ]]; then
    echo "$id" >>"$work/deleted.ids"
    printf 'url = "%s/v1/sessions/%s"\noutput = "/dev/null"\n' "$base" "$id"
  fi
done | curl_seq -X DELETE >"$work/delete.raw"
delete_bad=$(split_times "$work/delete.raw" "$work/delete.ms" 204)
sleep 1
# What the deleted sessions left behind (both should be 0). Only their workspaces count: the
# server's warm sessions (`--warm-sessions`) are mounted too, and rightly so.
touch "$work/deleted.ids"
leaked_mounts=$(awk -v w="$data/workspaces/" 'NR == FNR { gone[w $1] = 1; next } ($2 in gone)' \
  "$work/deleted.ids" /proc/mounts | wc -l)
leaked_zombies=$({ ps --ppid "$server_pid" -o stat= || true; } | awk '$1 ~ /^Z/' | wc -l)

# --- The load's sessions. ---
sessions=()
for i in $(seq "$nsessions"); do
  id=$(curl -sf -X POST "${json[@]}" -d '{"metadata":{"bench":"load"}}' "$base/v1/sessions" | session_id) ||
    die "cannot create session $i of $nsessions"
  [[ -n $id ]] || die "no id in the create reply of session $i"
  sessions+=("$id")
done

# --- 2. `1+1` round trip on one idle session (sequential, keep-alive). ---
say "2/3: $exec_n sequential executions of 1+1 on one session"
exec_cfg() { for _ in $(seq "$1"); do printf 'url = "%s/v1/sessions/%s/execute"\noutput = "/dev/null"\n' "$base" "${sessions[0]}"; done; }
exec_cfg 5 | curl_seq -X POST "${json[@]}" -d '{"code":"1+1"}' >/dev/null # warm-up
exec_cfg "$exec_n" | curl_seq -X POST "${json[@]}" -d '{"code":"1+1"}' >"$work/exec.raw"
exec_bad=$(split_times "$work/exec.raw" "$work/exec.ms" 200)
check=$(curl -s -X POST "${json[@]}" -d '{"code":"1+1"}' "$base/v1/sessions/${sessions[0]}/execute")
[[ $check == *'"text/plain":"2"'* ]] || die "1+1 did not return 2: $check"

# --- 3. The load. ---
if [[ $mode == pinned ]]; then
  threads=$nsessions
else
  threads=${WRK_THREADS:-$(nproc)}
  if (( threads > clients )); then threads=$clients; fi
fi
say "3/3: $clients clients for ${seconds}s over $nsessions sessions (wrk, $threads threads, $mode)"
cpu_before=$(awk '{print $14+$15}' "/proc/$server_pid/stat")
wrk -t "$threads" -c "$clients" -d "${seconds}s" --timeout 60s -s bench/load/execute.lua "$base" \
  -- "$mode" "${sessions[@]}" >"$work/wrk.out" 2>&1 || { cat "$work/wrk.out" >&2; die "wrk failed"; }
cpu_after=$(awk '{print $14+$15}' "/proc/$server_pid/stat")
get() { awk -v k="$1" '$1=="@@" && $2==k {print $3; f=1} END {if (!f) print 0}' "$work/wrk.out"; }
grep -q '^@@ requests' "$work/wrk.out" || { cat "$work/wrk.out" >&2; die "no results from wrk"; }

# Server-side state after the load: wrk abandons the requests in flight when it stops, and their
# sessions finish the queued executions first; then every session must be ready again.
rss_kb=$(awk '/^VmHWM/ {print $2}' "/proc/$server_pid/status")
for _ in $(seq 300); do
  after=$(curl -s "$base/v1/sessions?metadata.bench=load")
  [[ $after == *'"status":"busy"'* ]] || break
  sleep 0.1
done
ready=$({ grep -o '"status":"ready"' <<<"$after" || true; } | wc -l)

# --- Report. ---
requests=$(get requests)
dur_us=$(get duration_us)
ms() { awk -v us="$1" 'BEGIN {printf "%.1f", us/1000}'; }
rps=$(awk -v n="$requests" -v us="$dur_us" 'BEGIN {printf "%.0f", n/(us/1e6)}')
s2xx=0 s429=0 s4xx=0 s5xx=0
status_rows=""
while read -r _ key n; do
  code=${key#status_}
  status_rows+="| $code | $n |"$'\n'
  case $code in
    2??) s2xx=$((s2xx + n)) ;;
    429) s429=$((s429 + n)) ;;
    4??) s4xx=$((s4xx + n)) ;;
    5??) s5xx=$((s5xx + n)) ;;
  esac
done < <(grep '^@@ status_' "$work/wrk.out" | sort -k2)
sock_err=$(( $(get err_connect) + $(get err_read) + $(get err_write) ))
timeouts=$(get err_timeout)
bad_bodies=$(get bad_bodies)
exec_p50=$(pct "$work/exec.ms" 50)
load_p50=$(ms "$(get lat_p50_us)")
cpu_s=$(awk -v t="$((cpu_after - cpu_before))" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.0f", t/hz}')
cgroup=$([[ -f /sys/fs/cgroup/cgroup.controllers ]] && echo v2 || echo v1)

stamp=$(date +%Y%m%d-%H%M%S)
out=bench/results/load-$stamp.md
mkdir -p bench/results
{
  echo "# runcell HTTP load, $(date -u +'%Y-%m-%d %H:%M UTC')"
  echo
  # shellcheck disable=SC1091
  echo "Host: $(nproc) CPUs, $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r), cgroup $cgroup;" \
    "runcell $("$bin" --version 2>/dev/null | awk '{print $2}')" \
    "$([[ -n ${RUNCELL_BIN:-} ]] && echo "(RUNCELL_BIN; checkout" || echo "(built from")" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo '?'))," \
    "release build; server and wrk on the same host."
  echo
  echo "## Sequential (one client, keep-alive)"
  echo
  echo "| Request | n | p50 [ms] | p99 [ms] | max [ms] | unexpected status |"
  echo "|:---|---:|---:|---:|---:|---:|"
  echo "| \`POST /v1/sessions {}\` | $(wc -l <"$work/create.ms") | $(pct "$work/create.ms" 50) | $(pct "$work/create.ms" 99) | $(pct "$work/create.ms" 100) | $create_bad |"
  echo "| \`DELETE /v1/sessions/{id}\` | $(wc -l <"$work/delete.ms") | $(pct "$work/delete.ms" 50) | $(pct "$work/delete.ms" 99) | $(pct "$work/delete.ms" 100) | $delete_bad |"
  echo "| \`POST .../execute {\"code\":\"1+1\"}\`, one session | $(wc -l <"$work/exec.ms") | $exec_p50 | $(pct "$work/exec.ms" 99) | $(pct "$work/exec.ms" 100) | $exec_bad |"
  echo
  echo "Workspaces still mounted after the $create_n DELETEs: $leaked_mounts; zombie children of the server: $leaked_zombies (both should be 0)."
  echo
  if [[ $mode == pinned ]]; then
    echo "## Load: $clients clients, ${seconds} s, $nsessions sessions, \`1+1\`, pinned ($((clients / nsessions)) clients per session)"
  else
    echo "## Load: $clients clients, ${seconds} s, $nsessions sessions, \`1+1\` round-robin"
  fi
  echo
  echo "| Requests | Throughput [req/s] | p50 [ms] | p90 [ms] | p99 [ms] | max [ms] | p50 / sequential p50 |"
  echo "|---:|---:|---:|---:|---:|---:|---:|"
  echo "| $requests | $rps | $load_p50 | $(ms "$(get lat_p90_us)") | $(ms "$(get lat_p99_us)") | $(ms "$(get lat_max_us)") | $(awk -v a="$load_p50" -v b="$exec_p50" 'BEGIN {if (b > 0) printf "%.1fx", a/b; else print "n/a"}') |"
  echo
  echo "| Status | Count |"
  echo "|:---|---:|"
  printf '%s' "$status_rows"
  echo "| **2xx** | $s2xx |"
  echo "| **429** (session queue full) | $s429 |"
  echo "| **other 4xx** | $s4xx |"
  echo "| **5xx** | $s5xx |"
  echo "| socket errors (connect/read/write) | $sock_err |"
  echo "| client timeouts (60 s) | $timeouts |"
  echo "| 200 whose body is not \`1+1\` = 2 | $bad_bodies |"
  echo
  echo "wrk: $threads threads, $clients connections, 60 s client timeout. Latencies are of all" \
    "responses, 429s (answered at once) included."
  echo
  echo "Server during the load: ${cpu_s} s CPU in ${seconds} s (server process only; sandboxes are" \
    "separate processes); peak RSS $((rss_kb / 1024)) MiB. Sessions \`ready\` once the load drained: $ready of $nsessions."
} >"$out"
cat "$out"
say "results: $out"

fail=0
(( s5xx == 0 )) || { say "FAIL: $s5xx responses were 5xx"; fail=1; }
(( s2xx > 0 )) || { say "FAIL: no 2xx responses"; fail=1; }
(( sock_err + timeouts == 0 )) || { say "FAIL: $sock_err socket errors, $timeouts timeouts"; fail=1; }
(( bad_bodies == 0 )) || { say "FAIL: $bad_bodies replies were not a successful 1+1"; fail=1; }
(( create_bad + delete_bad + exec_bad == 0 )) || { say "FAIL: unexpected statuses in the sequential part"; fail=1; }
(( ready == nsessions )) || { say "FAIL: only $ready of $nsessions sessions are ready after the load"; fail=1; }
(( leaked_mounts + leaked_zombies == 0 )) ||
  say "warning: deleted sessions left $leaked_mounts workspace mounts and $leaked_zombies zombie processes"
exit "$fail"
