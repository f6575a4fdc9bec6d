# bcd: build, test and run the lab. See README.md.
SHELL := /bin/bash
GO ?= go
VERSION ?= 0.1.0-dev
RELEASE_SEQUENCE ?= 0
COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X github.com/better-compute/bcd/components/base/buildinfo.Version=$(VERSION) -X github.com/better-compute/bcd/components/base/buildinfo.Commit=$(COMMIT) -X github.com/better-compute/bcd/components/base/buildinfo.Sequence=$(RELEASE_SEQUENCE)
GOBUILD := CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)'
ROLES := node site ramdisk helper
# The helper is built without inlining (-l): about 340 kB smaller, toward
# its 5 MiB budget; its operations are a few a second (docs/decisions.md).
HELPER_GOFLAGS := -gcflags=all=-l

.PHONY: all build proto deps deps-lists kinds-lists mutate test soak soak-ha demo demo-ha sizes bench bench-scale clean fmt packages image qemu-test systemd-test

all: build

build: deps
	@mkdir -p bin
	@for r in $(ROLES); do $(GOBUILD) $$([ $$r = helper ] && echo '$(HELPER_GOFLAGS)') -o bin/bcd-$$r ./roles/$$r || exit 1; done
	$(GOBUILD) -o bin/bcgw ./cmd/bcgw
	$(GOBUILD) -o bin/bcx-ipmi ./cmd/bcx-ipmi
	$(GOBUILD) -o bin/bcrelease ./cmd/bcrelease
	$(GOBUILD) -tags fakehw -o bin/bcd-node-fakehw ./roles/node

# deps installs what the build and tests need on a Debian machine.
deps:
	@./build/deps.sh

proto:
	./build/proto.sh

# test runs every tier (unit and process tests, packaging, the package
# builder's tests, the QEMU tier under TCG) through cmd/testreport and ends
# with every skipped test and why (build/test.sh, docs/testing.md).
test: deps
	@GO=$(GO) ./build/test.sh

# image builds the ramdisk: images/out/{vmlinuz,initramfs.cpio.zst,ramdisk.ipxe} and their digests.
image: deps
	$(GO) run ./images/ramdisk -out images/out -ldflags '$(LDFLAGS)'

qemu-test: image
	@mkdir -p bin && $(GO) build -o bin/testreport ./cmd/testreport
	set -o pipefail; $(GO) test -json -count=1 -timeout 45m ./qemu-tests/ 2>&1 | tee bin/qemu-tier.json | bin/testreport -v -tier qemu

# systemd-test: the systemd tier alone (qemu-tests/systemd_test.go): the
# .deb installed, joined, restarted, rebooted, unprivileged and purged in
# a QEMU guest with systemd as PID 1. make test runs it in the qemu tier.
systemd-test: deps
	@mkdir -p bin && $(GO) build -o bin/testreport ./cmd/testreport
	set -o pipefail; $(GO) test -json -count=1 -timeout 35m -run '^TestSystemd$$' ./qemu-tests/ 2>&1 | bin/testreport -v -tier qemu

# soak runs the fault tests with many kill trials: exactly-once commands
# (1,000 trials) and desired state converging under kills (200).
soak: deps
	BCD_FAULT_TRIALS=$${BCD_FAULT_TRIALS:-1000} $(GO) test -count=1 -timeout 90m -run TestExactlyOnceUnderKills -v ./e2e/ | grep -E '^(fault test|---|ok|FAIL|PASS)'
	BCD_FAULT_TRIALS=$${BCD_CONVERGE_TRIALS:-200} $(GO) test -count=1 -timeout 60m -run TestConvergeUnderKills -v ./e2e/ | grep -E '^(converge fault test|---|ok|FAIL|PASS)'

# soak-ha: 1,000 bcd sim agents behind HAProxy in front of 3 bcgw on one
# PostgreSQL, commands and spec changes streaming, a gateway killed 100
# times (e2e/ha_soak_test.go; make test runs a short version).
soak-ha: deps
	set -o pipefail; BCD_HA_AGENTS=$${BCD_HA_AGENTS:-1000} BCD_HA_GATEWAYS=$${BCD_HA_GATEWAYS:-3} BCD_HA_TRIALS=$${BCD_HA_TRIALS:-100} \
		$(GO) test -count=1 -timeout 120m -run '^TestHAFailoverSoak$$' -v ./e2e/ | grep -E '^(ha soak|    ha_soak_test|---|ok|FAIL|PASS)'

demo: build
	@./build/demo.sh

# demo-ha: PostgreSQL (a cluster in a temp dir), two bcgw on it, HAProxy in
# front, three fakehw nodes; Ctrl-C stops all (build/demo-ha.sh).
demo-ha: build
	@./build/demo-ha.sh

# packages builds bcd-node, bcd-site (and the ramdisk images when images/out
# holds them) as .deb and .rpm for amd64 and arm64 into bin/packages/.
packages: deps
	./build/packages.sh

# sizes prints every binary's size, then for bcd-node, bcd-site and
# bcd-helper the 10 packages that take the most of it (cmd/binsize reads
# the symbols of the same build left unstripped, in bin/sizes/).
sizes: build image
	@ls -l bin/ | awk 'NR>1 && $$1 !~ /^d/ {printf "%-20s %10d bytes\n", $$9, $$5}'
	@mkdir -p bin/sizes && for r in node site helper; do CGO_ENABLED=0 $(GO) build -trimpath $$([ $$r = helper ] && echo '$(HELPER_GOFLAGS)') -o bin/sizes/bcd-$$r ./roles/$$r || exit 1; done
	@$(GO) run ./cmd/binsize -top 10 bin/sizes/bcd-node=bin/bcd-node bin/sizes/bcd-site=bin/bcd-site bin/sizes/bcd-helper=bin/bcd-helper
	@printf "%-20s %10d bytes\n" initramfs.cpio.zst $$(stat -c %s images/out/initramfs.cpio.zst)
	@./build/packages.sh

# bench prints each figure next to its reference measured in the same run:
# journal commands/s with fsync (1, 4, 16, 32 and 64 commands in flight,
# with fsyncs per command) against the raw fsync rate of the same
# directory measured within each run, and a bbolt-shaped commit at the
# disk (two fdatasyncs) against the raw fsync, bcd sim with 1,000 agents (BCD_SIM_NODES) against one agent
# alone, a signed command through the dispatcher against an unsigned one
# (and the ES256 verification alone), desired-state reporting's bytes and
# bcgw CPU with 1,000 sim agents against the same run without reporting,
# bcgw CPU with 200 sim agents with its metrics scraped every second against
# the same gateway unscraped,
# deploy.image against zstd -dc | dd and gzip -dc | dd, a node key's
# signature through bcd helper against one by the TPM (swtpm) directly, an
# idle bcd node against a sleep process (and with telemetry every 10 s
# against telemetry off), the helper's size against its
# budget, the gateway store on bbolt and PostgreSQL, tunnel throughput
# through bcgw tunnel --tcp against a direct loopback copy, daemon.upgrade
# to confirmed against a plain restart of the node and a release's
# download+verify against a plain copy of the same file, 10,000 bcd sim
# agents held by one bcgw on PostgreSQL against 1,000 in the same run
# (BCD_SCALE_NODES; docs/gateway-store.md, Scale), and PXE start to joined (and to the installed OS joined) from the
# QEMU tier's last run (bin/qemu-tier.json, kept by make test). It ends
# with one table of them all (cmd/benchtable), also in bin/bench/bench.txt
# and bin/bench/bench.json; the raw output is in bin/bench/raw.txt, and
# build/benchplot draws the journal and deploy figures over concurrency
# into bin/bench/journal.png and deploy.png.
BENCH_OUT := bin/bench
bench: deps
	@mkdir -p $(BENCH_OUT) && cat /proc/loadavg > $(BENCH_OUT)/loadavg-start && : > $(BENCH_OUT)/raw.txt
	$(GO) test -run '^$$' -bench . -benchtime 2s ./components/agent/journal/ | tee -a $(BENCH_OUT)/raw.txt | grep -E '^(Benchmark|ok)'
	$(GO) test -run '^$$' -bench BenchmarkSignedIntent -benchtime 500x ./components/agent/dispatch/ | tee -a $(BENCH_OUT)/raw.txt | grep -E '^(Benchmark|ok)'
	$(GO) test -run '^$$' -bench 'BenchmarkSim|BenchmarkReporting|BenchmarkIdleNode|BenchmarkGatewayMetrics' -benchtime 1x -timeout 40m ./e2e/ | tee -a $(BENCH_OUT)/raw.txt | grep -vE '^[[:space:]]*[{]'
	$(GO) test -run '^$$' -bench BenchmarkDeploy -benchtime 3x ./components/disk/deploy/ | tee -a $(BENCH_OUT)/raw.txt | grep -E '^(Benchmark|ok|deploy)'
	$(GO) test -run '^$$' -bench BenchmarkTPMSign -benchtime 200x ./components/helper/ | tee -a $(BENCH_OUT)/raw.txt | grep -E '^(Benchmark|ok)'
	$(GO) test -run '^$$' -bench BenchmarkStore -benchtime 2s ./components/gateway/store/ ./components/gateway/store/pgstore/ | tee -a $(BENCH_OUT)/raw.txt | grep -E '^(Benchmark|ok)'
	$(GO) test -run '^$$' -bench BenchmarkTunnel -benchtime 2x ./e2e/ | tee -a $(BENCH_OUT)/raw.txt | grep -vE '^[[:space:]]*[{]'
	$(GO) test -run '^$$' -bench BenchmarkDownload -benchtime 5x ./components/agent/update/ | tee -a $(BENCH_OUT)/raw.txt | grep -E '^(Benchmark|ok)'
	$(GO) test -run '^$$' -bench BenchmarkUpgrade -benchtime 1x ./e2e/ | tee -a $(BENCH_OUT)/raw.txt | grep -vE '^[[:space:]]*[{]'
	$(GO) test -run '^$$' -bench 'BenchmarkScale$$' -benchtime 1x -timeout 90m ./e2e/ | tee -a $(BENCH_OUT)/raw.txt | grep -vE '^[[:space:]]*[{]'
	@$(GOBUILD) $(HELPER_GOFLAGS) -o $(BENCH_OUT)/bcd-helper ./roles/helper
	@$(GOBUILD) -o $(BENCH_OUT)/bcd-node ./roles/node
	@$(GO) run ./cmd/benchtable -load-at-start $(BENCH_OUT)/loadavg-start -size bcd-helper=$(BENCH_OUT)/bcd-helper \
		-size bcd-node=$(BENCH_OUT)/bcd-node -size initramfs=images/out/initramfs.cpio.zst -qemu-log bin/qemu-tier.json \
		-scale $(BENCH_OUT)/scale.txt -json $(BENCH_OUT)/bench.json $(BENCH_OUT)/raw.txt | tee $(BENCH_OUT)/bench.txt
	@cd build/benchplot && $(GO) run . -in ../../$(BENCH_OUT)/raw.txt -out ../../$(BENCH_OUT)

# bench-scale is the failover at scale (e2e BenchmarkScaleHA): 10,000 bcd
# sim agents (BCD_SCALE_NODES) through HAProxy configured as
# build/haproxy.cfg in front of two bcgw on a durable PostgreSQL, one killed
# with SIGKILL while commands go through the other; each run prints its
# rows (time until every agent is back, commands lost and run twice, the
# round trip's p99, p99.9 and max before and after, of 3,000 each).
# BENCH_SCALE_RUNS runs (3) one after the other; the output is in
# bin/bench/scale.txt, the surviving gateway's execution traces and
# blocking and lock profiles in bin/bench/scale-profiles. About 7 minutes
# a run on 2 cores with nothing else running.
BENCH_SCALE_RUNS ?= 3
bench-scale: deps
	@mkdir -p $(BENCH_OUT)
	BCD_SCALE_PROFILES=$(CURDIR)/$(BENCH_OUT)/scale-profiles $(GO) test -run '^$$' -bench 'BenchmarkScaleHA$$' -benchtime 1x -count $(BENCH_SCALE_RUNS) -timeout 300m ./e2e/ | tee $(BENCH_OUT)/scale.txt | grep -vE '^[[:space:]]*[{]'

# otelcol builds the test collector (tools/otelcol, its own module) into
# bin/otelcol; the telemetry e2e test and make bench use it.
otelcol:
	@mkdir -p bin && cd tools/otelcol && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o ../../bin/otelcol .

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '^proto/gen/')

clean:
	rm -rf bin

# mutate breaks each safety rule of build/mutations.txt once, runs the
# tests that claim it and prints "N of N caught" (build/mutate.sh,
# docs/testing.md). MUTATE_ONLY=regex runs the matching ones.
mutate:
	@GO=$(GO) ./build/mutate.sh

# kinds-lists rewrites each role's checked-in kind table (roles/*/kinds.txt,
# which each role's TestKindTable pins).
kinds-lists:
	$(GO) test -count=1 -run '^TestKindTable$$' ./roles/node ./roles/site ./roles/ramdisk -update-kinds

# deps-lists rewrites each role's checked-in dependency list.
deps-lists:
	@for r in $(ROLES); do CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) list -deps ./roles/$$r > roles/$$r/deps.txt; done
