package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDraw: the journal's figures come out in order of commands in flight
// and both PNGs are written.
func TestDraw(t *testing.T) {
	in := `BenchmarkCommand/c=16-2   10000   205269 ns/op   4872 commands/s   0.75 fsyncs/command
BenchmarkCommand/c=1-2   1810   1210568 ns/op   826.1 commands/s   6.000 fsyncs/command
BenchmarkRawFsync-2   12028   177090 ns/op   5647 fsyncs/s
BenchmarkDeploy/zstd/zstd-dc-dd-2   3   1 ns/op   400.00 MB/s   798.9 cpu-ms/op
BenchmarkDeploy/zstd/bcd-2   3   1 ns/op   380.00 MB/s   789.6 cpu-ms/op
BenchmarkDeploy/zstd/bcd-goroutines=1-2   3   1 ns/op   300.00 MB/s   700 cpu-ms/op
`
	figs := parse(strings.NewReader(in))
	j := series(figs, "BenchmarkCommand/c=", "commands/s")
	if len(j) != 2 || j[0].X != 1 || j[0].Y != 826.1 || j[1].X != 16 {
		t.Fatalf("journal series %v", j)
	}
	dir := t.TempDir()
	if err := draw(filepath.Join(dir, "j.png"), "t", "x", "y", "bcd", j, "raw", 5647, true); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "j.png")); err != nil || !strings.HasPrefix(string(b), "\x89PNG") {
		t.Fatalf("no PNG: %v", err)
	}
	if err := draw(filepath.Join(dir, "none.png"), "t", "x", "y", "bcd", nil, "", 0, false); err == nil {
		t.Fatal("an empty series drawn")
	}
}
