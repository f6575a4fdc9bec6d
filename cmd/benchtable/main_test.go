package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkCommand/c=1-2         	    1810	   1210568 ns/op	       826.1 commands/s	         6.000 fsyncs/command
BenchmarkCommand/c=16-2        	   10000	    205269 ns/op	      4872 commands/s	         0.7548 fsyncs/command	      5647 raw-fsyncs/s	        8.000 writes/commit
BenchmarkRawFsync-2            	   12028	    177090 ns/op	      5647 fsyncs/s
BenchmarkScale-2   	       1	900000000000 ns/op	       150.0 joins/s	      2000 p50-us	      9000 p99-us	        40.00 gw-KiB/session	        45.00 ref-gw-KiB/session	      3000 gw-idle-cpu-ms/min	       400.0 ref-gw-idle-cpu-ms/min	        35.00 pg-rows/s	         3.500 ref-pg-rows/s	        30.00 pg-commits/s	         3.000 ref-pg-commits/s	       200.0 ref-joins/s	      1500 ref-p50-us	      5000 ref-p99-us	     10000 agents
BenchmarkDeploy/zstd/zstd-dc-dd-2         	       3	1691138478 ns/op	 400.00 MB/s	       798.9 cpu-ms/op
BenchmarkDeploy/zstd/bcd-2                	       3	1629695528 ns/op	 300.00 MB/s	       789.6 cpu-ms/op
deploy.image zstd: 165 MB/s (790 ms CPU), not a benchmark line
ok  	github.com/better-compute/bcd/components/agent/journal	14.232s
`

func find(rows []Row, figure string) Row {
	for _, r := range rows {
		if r.Figure == figure {
			return r
		}
	}
	return Row{}
}

// TestRows: figures and references are matched by benchmark and unit
// (the -GOMAXPROCS suffix dropped), the ratio is value/reference, a
// budget is met or missed, and a figure that did not run says so.
func TestRows(t *testing.T) {
	figs := map[metric]float64{}
	parse(strings.NewReader(sample), figs)
	figs[metric{"size/bcd-helper", "bytes"}] = 25 << 18 // 1.25x the 5 MiB budget
	rows := rows(figs)
	j := find(rows, "journal commands/s, 16 in flight")
	if j.Value == nil || *j.Value != 4872 || j.RefValue == nil || *j.RefValue != 5647 || j.Verdict != "missed" {
		t.Errorf("journal row %+v", j)
	}
	if r := find(rows, "journal fsyncs/command, 16 in flight"); r.Ratio == nil || *r.Ratio > 0.13 || r.Verdict != "" {
		t.Errorf("fsyncs row %+v", r)
	}
	if d := find(rows, "deploy.image zstd, MB/s"); d.Ratio == nil || *d.Ratio != 0.75 || d.Verdict != "missed" {
		t.Errorf("deploy row %+v", d)
	}
	if r := find(rows, "scale: PostgreSQL rows written/s at idle, 10,000"); r.Value == nil || *r.Value != 35 || r.RefValue == nil || *r.RefValue != 3.5 || r.Ratio == nil || *r.Ratio != 10 {
		t.Errorf("scale row %+v", r)
	}
	if g := find(rows, "deploy.image gzip, MB/s"); g.Value != nil || g.Verdict != "not measured" {
		t.Errorf("gzip row %+v", g)
	}
	if h := find(rows, "bcd-helper binary, bytes"); h.Ratio == nil || *h.Ratio != 1.25 || h.Verdict != "missed" {
		t.Errorf("helper row %+v", h)
	}
	figs[metric{"BenchmarkDeploy/zstd/bcd", "MB/s"}] = 390
	if d := find(rows2(figs), "deploy.image zstd, MB/s"); d.Verdict != "ok" {
		t.Errorf("deploy row at 0.975x: %+v", d)
	}
	if f := find(rows, "journal fsyncs/command, 1 in flight"); f.Value == nil || *f.Value != 6 || f.Verdict != "missed" {
		t.Errorf("fsyncs/command at 1 in flight, 6 against at most 2: %+v", f)
	}
	var out bytes.Buffer
	print(&out, Table{Rows: rows})
	if !strings.Contains(out.String(), "; missed 4; not measured ") || strings.Contains(out.String(), "budgets missed: 0") {
		t.Errorf("table:\n%s", out.String())
	}
}

// TestEveryBudgetARow: each budget of docs/ is a row, and a budget row
// whose figure is missing or measured by another target is "not
// measured", which keeps "budgets missed: 0" off the last line; it is
// printed only when every budget row was measured and met.
func TestEveryBudgetARow(t *testing.T) {
	figs := map[metric]float64{
		{"BenchmarkIdleNode", "node-KiB"}:      15000,
		{"BenchmarkIdleNode", "node-anon-KiB"}: 9000,
		{"BenchmarkScaleHA", "p99-ms"}:         10, // a go test line: not make bench-scale's runs
	}
	rs := rows(figs)
	for _, want := range []string{
		"journal commands/s, 1 in flight", "journal fsyncs/command, 1 in flight", "journal commands/s, 16 in flight",
		"deploy.image zstd, MB/s", "bcd-helper binary, bytes", "bcd-node binary, bytes", "initramfs.cpio.zst, bytes",
		"idle bcd node (fakehw) RSS KiB", "idle bcd node (fakehw) anonymous KiB",
		"p99 ms, 10,000 agents, two bcgw, each run", "failover s, 10,000 agents, one bcgw killed",
	} {
		if r := find(rs, want); r.Budget == "" {
			t.Errorf("no budget row %q", want)
		}
	}
	if r := find(rs, "idle bcd node (fakehw) RSS KiB"); r.Verdict != "ok" {
		t.Errorf("RSS 15,000 KiB against 16 MiB: %+v", r)
	}
	if r := find(rs, "idle bcd node (fakehw) anonymous KiB"); r.Verdict != "missed" {
		t.Errorf("anonymous 9,000 KiB against 8 MiB: %+v", r)
	}
	if r := find(rs, "p99 ms, 10,000 agents, two bcgw, each run"); r.Value != nil || r.Verdict != "not measured: run make bench-scale" {
		t.Errorf("a budget of make bench-scale: %+v", r)
	}
	if r := find(rs, "journal commands/s, 1 in flight"); r.Verdict != "not measured" {
		t.Errorf("a budget without its figure: %+v", r)
	}
	met := []Row{{Figure: "a", Budget: "<= 1", Verdict: "ok"}, {Figure: "b"}}
	var out bytes.Buffer
	print(&out, Table{Rows: met})
	if !strings.Contains(out.String(), "budgets missed: 0") {
		t.Errorf("every budget met:\n%s", out.String())
	}
	out.Reset()
	print(&out, Table{Rows: append(met, Row{Figure: "c", Budget: "<= 1", Verdict: "not measured"})})
	if strings.Contains(out.String(), "budgets missed: 0") || !strings.Contains(out.String(), "missed 0; not measured 1") {
		t.Errorf("a budget not measured:\n%s", out.String())
	}
}

func rows2(figs map[metric]float64) []Row { return rows(figs) }

// TestPXE takes the two PXE times from the QEMU tier's JSON output.
func TestPXE(t *testing.T) {
	in := `{"Action":"output","Output":"    pxe_test.go:570: PXE: QEMU start -\u003e ramdisk init 10.1s -\u003e bc.* printed 12s -\u003e joined bcgw as a ramdisk 20.3s -\u003e installed OS's init (kexec) 50s -\u003e joined as node node_abc 1m2.5s; initramfs 123 bytes\n"}
not json
`
	figs := map[metric]float64{}
	pxe(strings.NewReader(in), figs)
	if figs[metric{"qemu/pxe-joined", "s"}] != 20.3 || figs[metric{"qemu/os-joined", "s"}] != 62.5 {
		t.Fatalf("figures %v", figs)
	}
}

// scaleRun is one run's summary as BenchmarkScaleHA prints it.
func scaleRun(failover, p99before, p99after float64, lost, twice int) string {
	return fmt.Sprintf(`bench-scale: 10000 agents, two bcgw behind HAProxy (build/haproxy.cfg), one killed, on 2 cores (load average 7.28 7.62 7.66 at the end):
  failover: all agents back after the kill %10.1f s    (budget <= 60)
  idle gateway CPU s/min per 1,000 sessions          1.17
  commands accepted during the failover               277      (0 sends refused)
  commands lost                              %10d      (budget 0)
  commands run twice                         %10d      (budget 0)
  round trip p99, before the kill            %10.1f ms   (budget <= 250)
  round trip p99.9, before the kill                  79.9 ms
  round trip max, before the kill                   317.3 ms
  round trip p99, after the kill             %10.1f ms   (budget <= 250)
  round trip p99.9, after the kill                  923.6 ms
  round trip max, after the kill                   1281.8 ms
`, failover, lost, twice, p99before, p99after)
}

// make bench-scale's budgets take the worst of its runs, and pass only
// from three runs that each met them.
func TestScaleRuns(t *testing.T) {
	for _, c := range []struct {
		name                  string
		out                   string
		p99, failover, lostTw string // verdicts
	}{
		{"three good runs", scaleRun(46.1, 19.3, 12.6, 0, 0) + scaleRun(35.1, 21.1, 22, 0, 0) + scaleRun(39.9, 17.7, 14.3, 0, 0), "ok", "ok", "ok"},
		{"one slow failover", scaleRun(46.1, 19.3, 12.6, 0, 0) + scaleRun(66.6, 21.1, 22, 0, 0) + scaleRun(39.9, 17.7, 14.3, 0, 0), "ok", "missed", "ok"},
		{"one slow p99 after", scaleRun(46.1, 19.3, 12.6, 0, 0) + scaleRun(35.1, 21.1, 310, 0, 0) + scaleRun(39.9, 17.7, 14.3, 0, 0), "missed", "ok", "ok"},
		{"a command run twice", scaleRun(46.1, 19.3, 12.6, 0, 0) + scaleRun(35.1, 21.1, 22, 0, 1) + scaleRun(39.9, 17.7, 14.3, 0, 0), "ok", "ok", "missed"},
		{"two runs", scaleRun(46.1, 19.3, 12.6, 0, 0) + scaleRun(35.1, 21.1, 22, 0, 0), "not measured: 2 of 3 runs", "not measured: 2 of 3 runs", "not measured: 2 of 3 runs"},
		{"two runs, one lost", scaleRun(46.1, 19.3, 12.6, 1, 0) + scaleRun(35.1, 21.1, 22, 0, 0), "not measured: 2 of 3 runs", "not measured: 2 of 3 runs", "missed"},
		{"none", "", "not measured: run make bench-scale", "not measured: run make bench-scale", "not measured: run make bench-scale"},
	} {
		t.Run(c.name, func(t *testing.T) {
			figs := map[metric]float64{}
			scaleFigures(strings.NewReader(c.out), figs)
			rs := rows(figs)
			for fig, want := range map[string]string{
				"p99 ms, 10,000 agents, two bcgw, each run":  c.p99,
				"failover s, 10,000 agents, one bcgw killed": c.failover,
				"commands lost or run twice, failover":       c.lostTw,
			} {
				if r := find(rs, fig); r.Verdict != want {
					t.Errorf("%s: %q, want %q (%+v)", fig, r.Verdict, want, r)
				}
			}
		})
	}
	figs := map[metric]float64{}
	scaleFigures(strings.NewReader(scaleRun(46.1, 19.3, 12.6, 0, 0)+scaleRun(35.1, 21.1, 22, 0, 0)+scaleRun(39.9, 17.7, 14.3, 0, 0)), figs)
	if figs[metric{"bench-scale", "failover-s"}] != 46.1 || figs[metric{"bench-scale", "p99-ms"}] != 22 || figs[metric{"bench-scale", "runs"}] != 3 {
		t.Errorf("worst of three runs: %v", figs)
	}
}
