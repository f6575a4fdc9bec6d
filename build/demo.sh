#!/usr/bin/env bash
# make demo: a lab gateway, three fakehw node agents joined to it, and
# commands round-tripping. Ctrl-C stops everything (DEMO_SECONDS=N stops
# by itself after N seconds). All traffic stays on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/bin
demo=$(mktemp -d /tmp/bcd-demo.XXXXXX)
pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "demo: stopped; logs and state were in $demo"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

"$bin/bcgw" serve --data-dir "$demo/gw" --listen 127.0.0.1:0 2>"$demo/bcgw.log" &
pids+=($!)
addr=
for _ in $(seq 100); do
  addr=$(grep -o '"msg":"bcgw serving"[^}]*"addr":"[^"]*"' "$demo/bcgw.log" 2>/dev/null | sed 's/.*"addr":"\([^"]*\)"/\1/' || true)
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { echo "demo: bcgw did not start:"; cat "$demo/bcgw.log"; exit 1; }
export BCGW_DATA_DIR=$demo/gw
echo "demo: bcgw serving on https://$addr (state in $demo/gw)"

pins=$("$bin/bcgw" well-known --pins)
token=$("$bin/bcgw" token create --uses 3 --site demo)
for i in 1 2 3; do
  d=$demo/node$i
  # The token goes in on stdin: never on a command line.
  # shellcheck disable=SC2086
  printf '%s\n' "$token" | "$bin/bcd-node-fakehw" join --config "$d/config.toml" --data-dir "$d/data" \
    --server "https://$addr" $pins
  # Three agents on one machine: each gets its own status socket.
  sed -i "s|^socket_path = .*|socket_path = \"$d/run/bcd.sock\"|" "$d/config.toml"
  BCD_FAKEHW_SEED=$i "$bin/bcd-node-fakehw" node --config "$d/config.toml" 2>"$d/node.log" &
  pids+=($!)
done
unset token

for _ in $(seq 100); do
  [ "$("$bin/bcgw" nodes --json | grep -c '"connected": true')" = 3 ] && break
  sleep 0.1
done
echo
"$bin/bcgw" nodes
echo
for id in $("$bin/bcgw" nodes --json | sed -n 's/.*"id": "\(node_[a-z0-9]*\)".*/\1/p'); do
  echo "demo: bcgw run $id agent.ping --wait"
  "$bin/bcgw" run "$id" agent.ping --wait
done
# Desired state: a fakehw test section on the first node, converged and
# reported back.
first=$("$bin/bcgw" nodes --json | sed -n 's/.*"id": "\(node_[a-z0-9]*\)".*/\1/p' | head -1)
echo '{"fakehw":{"files":{"motd":"hello from the desired state"}}}' > "$demo/spec.json"
echo "demo: bcgw spec set $first --file $demo/spec.json"
gen=$("$bin/bcgw" spec set "$first" --file "$demo/spec.json")
for _ in $(seq 100); do
  "$bin/bcgw" status "$first" --json | grep -q "\"observed_generation\": $gen" && break
  sleep 0.1
done
echo "demo: bcgw status $first"
"$bin/bcgw" status "$first"
echo
echo "demo: bcd status --config $demo/node1/config.toml"
"$bin/bcd-node-fakehw" status --config "$demo/node1/config.toml"
echo
echo "demo: running; logs in $demo (bcgw.log, node*/node.log). Ctrl-C stops all."
if [ -n "${DEMO_SECONDS:-}" ]; then sleep "$DEMO_SECONDS"; else while :; do sleep 3600; done; fi
