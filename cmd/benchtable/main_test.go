package main

import (
	"bytes"
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
	var out bytes.Buffer
	print(&out, Table{Rows: rows})
	if !strings.Contains(out.String(), "budgets missed: 3") {
		t.Errorf("table:\n%s", out.String())
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
