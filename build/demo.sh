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
# Instances on the fakehw runtime: a qcow2 base image served over https on
# loopback (openssl s_server, its key outside the served directory) and
# fetched through its SPKI pin.
mkdir -p "$demo/images" "$demo/images-tls"
qemu-img create -q -f qcow2 "$demo/images/base.qcow2" 64M
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bcd-demo-images \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$demo/images-tls/key.pem" -out "$demo/images-tls/cert.pem" 2>/dev/null
pin="sha256/$(openssl x509 -in "$demo/images-tls/cert.pem" -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64)"
port=$((20000 + RANDOM % 20000))
(cd "$demo/images" && exec openssl s_server -quiet -accept "127.0.0.1:$port" -WWW \
  -cert "$demo/images-tls/cert.pem" -key "$demo/images-tls/key.pem") >"$demo/images.log" 2>&1 &
pids+=($!)
sum=$(sha256sum "$demo/images/base.qcow2" | cut -d' ' -f1)
vm() { printf '{"id":"%s","allocation":"demo","state":"%s","vcpus":1,"memory_mib":512,"image":"%s"}' "$1" "$2" "$sum"; }
instances=$(printf '{"images":[{"sha256":"%s","url":"https://127.0.0.1:%s/base.qcow2","format":"qcow2","spki_pin":"%s"}],"instances":[%s,%s]}' \
  "$sum" "$port" "$pin" "$(vm vm-1 RUNNING)" "$(vm vm-2 PAUSED)")

# Desired state: a fakehw test section and two instances on the first
# node, converged and reported back.
first=$("$bin/bcgw" nodes --json | sed -n 's/.*"id": "\(node_[a-z0-9]*\)".*/\1/p' | head -1)
echo '{"fakehw":{"files":{"motd":"hello from the desired state"}},"instances":'"$instances"'}' > "$demo/spec.json"
echo "demo: bcgw spec set $first --file $demo/spec.json"
gen=$("$bin/bcgw" spec set "$first" --file "$demo/spec.json")
for _ in $(seq 300); do
  "$bin/bcgw" status "$first" --json | grep -q "\"observed_generation\": $gen" && break
  sleep 0.1
done
echo "demo: bcgw status $first"
"$bin/bcgw" status "$first"
echo
echo "demo: bcd status --config $demo/node1/config.toml"
"$bin/bcd-node-fakehw" status --config "$demo/node1/config.toml"
echo
echo "demo: the instances' records on the fakehw runtime (node*/data/fakehw/runtime)"
for f in "$demo"/node*/data/fakehw/runtime/*.json; do [ -e "$f" ] && echo "$f: $(cat "$f")"; done
echo
echo "demo: running; logs in $demo (bcgw.log, node*/node.log). Ctrl-C stops all."
if [ -n "${DEMO_SECONDS:-}" ]; then sleep "$DEMO_SECONDS"; else while :; do sleep 3600; done; fi
