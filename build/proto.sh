#!/usr/bin/env bash
# Regenerates proto/gen from proto/ with protoc, protoc-gen-go and
# protoc-gen-connect-go (the versions go.mod pins as tools).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-proto/gen}
command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$tmp/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go
mkdir -p "$out"
protoc -I proto \
  --plugin=protoc-gen-go="$tmp/protoc-gen-go" --plugin=protoc-gen-connect-go="$tmp/protoc-gen-connect-go" \
  --go_out="$out" --go_opt=paths=source_relative \
  --connect-go_out="$out" --connect-go_opt=paths=source_relative \
  $(cd proto && find . -name "*.proto" | sed "s,^\./,," | sort)
