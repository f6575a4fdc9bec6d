#!/usr/bin/env bash
# make test: every tier, each through cmd/testreport, then one list of
# every skipped test with its reason and the totals. A failed tier does
# not stop the others; the script exits 1 if any failed. Under CI (CI set
# to anything) a test that lacks a tool or root fails instead of skipping
# (components/base/testenv). See docs/testing.md.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mkdir -p bin
$GO build -o bin/testreport ./cmd/testreport || exit 1
skips=$(mktemp /tmp/bcd-skips.XXXXXX)
trap 'rm -f "$skips"' EXIT
failed=()

# tier NAME CMD...: runs CMD (a go test -json), reported by testreport.
tier() {
  local name=$1; shift
  echo "== tier $name"
  if ! "$@" 2>&1 | bin/testreport -skips "$skips" ${REPORT_FLAGS:-}; then
    failed+=("$name")
  fi
}

echo "== go vet"
$GO vet ./... || failed+=(vet)
$GO vet -tags fakehw ./... || failed+=(vet-fakehw)

# The telemetry e2e test's OpenTelemetry Collector (tools/otelcol, its own
# module): built once into bin/otelcol and kept; rm it to rebuild.
if [ ! -x bin/otelcol ]; then
  echo "== build bin/otelcol (tools/otelcol)"
  (cd tools/otelcol && CGO_ENABLED=0 $GO build -trimpath -ldflags '-s -w' -o ../../bin/otelcol .) || failed+=(otelcol)
fi

# The instances' Debian guest (components/vm/guestimage), built once and
# cached before the tests that boot it (e2e, imds): its first build takes
# minutes, which would otherwise count against their packages' timeouts.
tier "guest image" $GO test -json -count=1 -timeout 30m ./components/vm/guestimage/

# unit, e2e and packaging tests: one go test, each package reported under
# its tier (testreport names it by path). The timeout is each package's: e2e
# boots the instances' Debian guest four times under TCG (3-5 minutes each
# on a loaded machine; TestMemorySnapshotOfRealGuest about 5.5 minutes)
# beside its other tests, 17-26 minutes in all. The output is kept in
# bin/unit-tier.json for each test's time.
tier "unit, e2e, packaging" bash -c "set -o pipefail; $GO test -json -count=1 -timeout 45m $($GO list ./... | grep -v -e /qemu-tests -e /components/vm/guestimage | tr '\n' ' ') | tee bin/unit-tier.json"

echo "== build/benchplot (make bench's plots, its own module)"
(cd build/benchplot && $GO vet ./... && $GO test -count=1 ./...) || failed+=(benchplot)

echo "== go vet build/pkg"
(cd build/pkg && $GO vet ./...) || failed+=(vet-pkg)
REPORT_FLAGS="-tier pkg" tier "package builder" bash -c "cd build/pkg && $GO test -json -count=1 ./..."

# The QEMU tier prints its VMs' progress as it goes (-v); it includes the
# systemd tier (TestSystemd, make systemd-test), whose quick start step
# alone runs 5-9 minutes under TCG: 40 minutes for the package.
if make --no-print-directory image; then
  # Its output is kept in bin/qemu-tier.json: make bench reads the PXE times from it.
  REPORT_FLAGS="-v -tier qemu" tier qemu bash -c "set -o pipefail; $GO test -json -count=1 -timeout 40m ./qemu-tests/ | tee bin/qemu-tier.json"
else
  failed+=("qemu (make image)")
fi

bin/testreport summary -skips "$skips"
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
