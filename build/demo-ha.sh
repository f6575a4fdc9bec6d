#!/usr/bin/env bash
# make demo-ha: the gateway as a fleet runs it. A PostgreSQL cluster made
# by this script in a temp dir (Debian's postgresql, unprivileged, on a unix
# socket only), two bcgw sharing its database, HAProxy in TCP mode in front
# of them (TLS passed through), and three fakehw node agents that dial only
# HAProxy. Commands go through either gateway's admin API. Ctrl-C stops
# everything (DEMO_SECONDS=N stops by itself after N seconds). All traffic
# stays on 127.0.0.1. docs/gateway-store.md explains the pieces.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/bin
demo=$(mktemp -d /tmp/bcd-demo-ha.XXXXXX)
chmod 711 "$demo"
pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "demo-ha: stopped; logs and state were in $demo"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

# Debian's server binaries, the newest version, else initdb on PATH.
pgbin=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -1)
if [ ! -x "$pgbin/initdb" ] && command -v initdb >/dev/null 2>&1; then
  pgbin=$(dirname "$(command -v initdb)")
fi
[ -x "$pgbin/postgres" ] || { echo "demo-ha: PostgreSQL's initdb and postgres not found; apt-get install postgresql (build/deps.sh does)"; exit 1; }
command -v haproxy >/dev/null || { echo "demo-ha: haproxy not found; apt-get install haproxy (build/deps.sh does)"; exit 1; }

# postgres refuses to run as root: as root, the cluster runs as nobody.
pg=$demo/pg
mkdir -p "$pg"
as=()
if [ "$(id -u)" = 0 ]; then
  chown nobody:nogroup "$pg"
  as=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
fi
"${as[@]}" "$pgbin/initdb" -D "$pg/data" -U bcgw --auth=trust -E UTF8 --locale=C >"$demo/initdb.log" 2>&1 \
  || { echo "demo-ha: initdb failed:"; cat "$demo/initdb.log"; exit 1; }
"${as[@]}" "$pgbin/postgres" -D "$pg/data" -k "$pg" -c listen_addresses= -c max_connections=200 2>"$demo/postgres.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$pg/.s.PGSQL.5432" ] && break; sleep 0.1; done
[ -S "$pg/.s.PGSQL.5432" ] || { echo "demo-ha: postgres did not start:"; cat "$demo/postgres.log"; exit 1; }
createdb=$pgbin/createdb
[ -x "$createdb" ] || createdb=createdb
"$createdb" -h "$pg" -U bcgw bcgw
printf 'postgres:///bcgw?host=%s&user=bcgw\n' "$pg" >"$demo/database.url"
chmod 600 "$demo/database.url"
echo "demo-ha: PostgreSQL on $pg (database bcgw)"

# Free loopback ports for HAProxy and the two gateways.
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
ha=127.0.0.1:$(free_port)
gw=("127.0.0.1:$(free_port)" "127.0.0.1:$(free_port)")
health=("127.0.0.1:$(free_port)" "127.0.0.1:$(free_port)") # each gateway's health check (--health)

# The fleet's key-encryption key: every gateway gets the same file, and the
# first stores the gateways' keys in the database sealed under it; the
# other reads them there (no key files are copied between gateways).
"$bin/bcgw" kek generate --out "$demo/bcgw.kek"

start_gw() { # index
  local i=$1 d=$demo/gw$(($1 + 1))
  "$bin/bcgw" serve --name "gw$(($1 + 1))" --data-dir "$d" --listen "${gw[$i]}" --url "https://$ha" \
    --health "${health[$i]}" --database-file "$demo/database.url" --key-encryption-key "$demo/bcgw.kek" 2>"$d.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q '"msg":"bcgw serving"' "$d.log" 2>/dev/null && return; sleep 0.1; done
  echo "demo-ha: bcgw $((i + 1)) did not start:"; cat "$d.log"; exit 1
}
start_gw 0
start_gw 1
echo "demo-ha: bcgw 1 on https://${gw[0]}, bcgw 2 on https://${gw[1]}"

# build/haproxy.cfg, the configuration docs/gateway-store.md shows, filled in.
servers="    server gw1 ${gw[0]} check port ${health[0]##*:}\n    server gw2 ${gw[1]} check port ${health[1]##*:}"
sed -e "s|@MAXCONN@|4096|" -e "s|@BIND@|$ha|" -e "s|@SERVERS@|$servers|" build/haproxy.cfg >"$demo/haproxy.cfg"
haproxy -c -q -f "$demo/haproxy.cfg"
haproxy -db -f "$demo/haproxy.cfg" 2>"$demo/haproxy.log" &
pids+=($!)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/${ha%:*}/${ha#*:}") 2>/dev/null && break; sleep 0.1; done
echo "demo-ha: HAProxy on $ha in front of both (agents dial only this)"

export BCGW_DATA_DIR=$demo/gw1
pins=$("$bin/bcgw" well-known --pins)
token=$("$bin/bcgw" token create --uses 3 --site demo)
for i in 1 2 3; do
  d=$demo/node$i
  # The token goes in on stdin: never on a command line.
  # shellcheck disable=SC2086
  printf '%s\n' "$token" | "$bin/bcd-node-fakehw" join --config "$d/config.toml" --data-dir "$d/data" \
    --server "https://$ha" $pins
  sed -i "s|^socket_path = .*|socket_path = \"$d/run/bcd.sock\"|" "$d/config.toml"
  BCD_FAKEHW_SEED=$i "$bin/bcd-node-fakehw" node --config "$d/config.toml" 2>"$d/node.log" &
  pids+=($!)
done
unset token

connected() { # data dir -> how many nodes have their session on that gateway (its --name)
  "$bin/bcgw" nodes --json --data-dir "$1" | grep -c "\"gateway\": \"$(basename "$1")\"" || true
}
for _ in $(seq 150); do
  [ $(($(connected "$demo/gw1") + $(connected "$demo/gw2"))) = 3 ] && break
  sleep 0.1
done
for g in 1 2; do
  echo
  echo "demo-ha: bcgw nodes --data-dir $demo/gw$g ($(connected "$demo/gw$g") sessions on this gateway)"
  "$bin/bcgw" nodes --data-dir "$demo/gw$g"
done
echo
g=1
for id in $("$bin/bcgw" nodes --json | sed -n 's/.*"id": "\(node_[a-z0-9]*\)".*/\1/p'); do
  echo "demo-ha: bcgw run $id fakehw.mark --wait --data-dir $demo/gw$g"
  "$bin/bcgw" run "$id" fakehw.mark --wait --data-dir "$demo/gw$g"
  g=$((3 - g))
done
echo
echo "demo-ha: running; logs in $demo (gw1.log, gw2.log, haproxy.log, postgres.log, node*/node.log)."
echo "demo-ha: try: kill -9 one bcgw (pids ${pids[1]} and ${pids[2]}), then bcgw nodes --data-dir $demo/gw1 and gw2. Ctrl-C stops all."
if [ -n "${DEMO_SECONDS:-}" ]; then sleep "$DEMO_SECONDS"; else while :; do sleep 3600; done; fi
