#!/usr/bin/env bash
# Routing between nodes, measured side by side in one run: one PostgreSQL (initdb + pg_ctl in a
# temporary directory, Unix socket only) and NODES runcell nodes (default 3) on this machine,
# each with its zygote and warm pool; then bench/cluster.py: a session's GET and a `1+1`
# execute at its owner and through another node, and creates from the warm pool pinned, pinned
# through another node, and placed (unpinned) through every node. Everything is removed at the
# end (nodes stopped, workspaces unmounted, the database server stopped).
#
# Usage: RUNCELL_BIN=target/release/runcell bench/cluster.sh     (root, like the other benches)
# Debian's postgresql binaries (/usr/lib/postgresql/*/bin, or PG_BIN=DIR); curl, python3,
# openssl. The Python runtime comes from RUNCELL_BENCH_DATA (default /var/tmp/runcell-bench;
# install it first with `runcell runtime install --data-dir /var/tmp/runcell-bench`).
set -euo pipefail
bin=$(realpath "${RUNCELL_BIN:-target/debug/runcell}")
[[ -x $bin ]] || { echo "no runcell binary at $bin (set RUNCELL_BIN)" >&2; exit 1; }
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
[[ -d $cache/runtimes ]] || { echo "no runtime in $cache: runcell runtime install --data-dir $cache" >&2; exit 1; }
pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
[[ -x $pg_bin/initdb ]] || { echo "no PostgreSQL binaries (apt-get install postgresql, or PG_BIN=DIR)" >&2; exit 1; }
nodes=${NODES:-3}
here=$(dirname "$(realpath "$0")")

work=$(mktemp -d /var/tmp/rc-cluster.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [[ -f $work/pg/data/postmaster.pid ]] && as_pg "$pg_bin/pg_ctl" -D "$work/pg/data" -m immediate stop >/dev/null 2>&1 || true
  awk -v w="$work/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$work"
}
trap cleanup EXIT
# PostgreSQL refuses to run as root: as root it runs as nobody, who owns its directory.
as_pg() { if (( EUID == 0 )); then setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; else "$@"; fi; }
mkdir -p "$work/pg"
(( EUID == 0 )) && chown nobody:nogroup "$work/pg"
as_pg "$pg_bin/initdb" -D "$work/pg/data" -U runcell --auth=trust -E UTF8 --locale=C --no-sync >/dev/null
as_pg "$pg_bin/pg_ctl" -D "$work/pg/data" -w -t 60 -l "$work/pg/log" \
  -o "-k $work/pg -c listen_addresses='' -c max_connections=100" start >/dev/null
url="postgres://runcell@/postgres?host=$work/pg"

mkdir -p "$work/keys"
openssl rand -hex 32 > "$work/keys/audit-chain.key"
openssl rand -hex 32 > "$work/keys/audit-signing.key"
openssl rand -hex 32 > "$work/keys/cluster.secret"
shared=(--database "$url" --audit-key-file "$work/keys/audit-chain.key"
        --audit-signing-key-file "$work/keys/audit-signing.key")
key=$(RUNCELL_DATA_DIR="$work/keys" "$bin" "${shared[@]}" keys create --name bench 2>/dev/null | tail -1)

urls=()
for i in $(seq "$nodes"); do
  data=$work/node$i
  mkdir -p "$data"; ln -s "$(realpath "$cache")/runtimes" "$data/runtimes"
  port=$((20000 + RANDOM % 40000))
  RUST_LOG=warn "$bin" serve --listen "127.0.0.1:$port" --data-dir "$data" --node-url "http://127.0.0.1:$port" \
    "${shared[@]}" --cluster-secret-file "$work/keys/cluster.secret" >/dev/null 2>"$data/log" </dev/null &
  pids+=($!)
  urls+=("http://127.0.0.1:$port")
done
for u in "${urls[@]}"; do
  for _ in $(seq 1200); do
    h=$(curl -sf -H "Authorization: Bearer $key" "$u/healthz" || true)
    [[ $h == *'"state":"ready"'* && $h != *'"warm_sessions":0'* ]] && break
    sleep 0.1
  done
  [[ $h == *'"state":"ready"'* ]] || { echo "node $u did not get ready: $h" >&2; for l in "$work"/node*/log; do echo "== $l" >&2; tail -n 20 "$l" >&2; done; exit 1; }
done
echo "runcell: $bin ($("$bin" --version 2>/dev/null || true)); $nodes nodes on one PostgreSQL ($("$pg_bin/postgres" --version))"
echo "machine: $(nproc) cores; uptime:$(uptime | sed 's/.*load average/ load average/')"
python3 "$here/cluster.py" "$key" "${urls[@]}"
echo "uptime after:$(uptime | sed 's/.*load average/ load average/')"
