package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stream is go test -json for a package with a pass, a skip with its
// reason, a failure with its output and a subtest, as go 1.26 writes it.
const stream = `{"Action":"start","Package":"github.com/better-compute/bcd/components/x"}
{"Action":"run","Package":"github.com/better-compute/bcd/components/x","Test":"TestA"}
{"Action":"output","Package":"github.com/better-compute/bcd/components/x","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"github.com/better-compute/bcd/components/x","Test":"TestA","Output":"{\"level\":\"INFO\",\"msg\":\"a log line\"}\n"}
{"Action":"pass","Package":"github.com/better-compute/bcd/components/x","Test":"TestA"}
{"Action":"run","Package":"github.com/better-compute/bcd/components/x","Test":"TestB"}
{"Action":"output","Package":"github.com/better-compute/bcd/components/x","Test":"TestB","Output":"=== RUN   TestB\n"}
{"Action":"output","Package":"github.com/better-compute/bcd/components/x","Test":"TestB","Output":"    x_test.go:9: SKIPPED: swtpm is not installed\n"}
{"Action":"output","Package":"github.com/better-compute/bcd/components/x","Test":"TestB","Output":"--- SKIP: TestB (0.00s)\n"}
{"Action":"skip","Package":"github.com/better-compute/bcd/components/x","Test":"TestB"}
{"Action":"run","Package":"github.com/better-compute/bcd/components/x","Test":"TestC/sub"}
{"Action":"output","Package":"github.com/better-compute/bcd/components/x","Test":"TestC/sub","Output":"    x_test.go:12: wanted 1, got 2\n"}
{"Action":"fail","Package":"github.com/better-compute/bcd/components/x","Test":"TestC/sub"}
{"Action":"fail","Package":"github.com/better-compute/bcd/components/x","Test":"TestC"}
{"Action":"output","Package":"github.com/better-compute/bcd/components/x","Output":"FAIL\tgithub.com/better-compute/bcd/components/x\t0.1s\n"}
{"Action":"fail","Package":"github.com/better-compute/bcd/components/x"}
{"Action":"skip","Package":"github.com/better-compute/bcd/e2e","Test":"TestD"}
not json: printed as it is
`

func TestReport(t *testing.T) {
	var out bytes.Buffer
	r := &report{out: &out, buf: map[string][]string{}, totals: map[string]*Totals{}}
	if err := r.read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	r.printTotals()
	got := out.String()
	for _, want := range []string{"wanted 1, got 2", "FAIL\tgithub.com/better-compute/bcd/components/x", "not json: printed as it is",
		"e2e: 0 passed, 0 failed, 1 skipped\n", "unit: 1 passed, 2 failed, 1 skipped\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "a log line") {
		t.Errorf("a passing test's output was printed:\n%s", got)
	}
	if !r.failed {
		t.Error("a failed test does not fail the report")
	}
	if len(r.skips) != 2 || r.skips[0].Reason != "x_test.go:9: SKIPPED: swtpm is not installed" || r.skips[1].Tier != "e2e" {
		t.Errorf("skips = %+v", r.skips)
	}

	path := filepath.Join(t.TempDir(), "skips")
	if err := r.record(path); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := summary(path, &out); code != 0 {
		t.Fatalf("summary = %d", code)
	}
	got = out.String()
	for _, want := range []string{"skipped (2), and why:", "components/x TestB: x_test.go:9: SKIPPED: swtpm is not installed", "\ntotal: 1 passed, 2 failed, 2 skipped\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
}

// TestVerboseKeepsSkipReasons: with -v (the QEMU tier) every output line
// is printed as it comes, JSON log lines left out, and a skip still has
// its reason; a failure's output is not printed twice.
func TestVerboseKeepsSkipReasons(t *testing.T) {
	var out bytes.Buffer
	r := &report{out: &out, verbose: true, buf: map[string][]string{}, totals: map[string]*Totals{}}
	if err := r.read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	if len(r.skips) != 2 || r.skips[0].Reason != "x_test.go:9: SKIPPED: swtpm is not installed" {
		t.Errorf("verbose skips = %+v, want TestB's reason", r.skips)
	}
	got := out.String()
	if strings.Contains(got, "a log line") || strings.Count(got, "wanted 1, got 2") != 1 || !strings.Contains(got, "=== RUN   TestA") {
		t.Errorf("verbose output:\n%s", got)
	}
}

func TestReportBuildFailure(t *testing.T) {
	var out bytes.Buffer
	r := &report{out: &out, buf: map[string][]string{}, totals: map[string]*Totals{}}
	r.read(strings.NewReader(`{"ImportPath":"x","Action":"build-output","Output":"x.go:1: syntax error\n"}
{"ImportPath":"x","Action":"build-fail"}
`))
	if !r.failed || !strings.Contains(out.String(), "syntax error") {
		t.Errorf("a build failure: failed %v, output %q", r.failed, out.String())
	}
}

func TestSummaryOfNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "skips")
	os.WriteFile(path, nil, 0o644)
	var out bytes.Buffer
	summary(path, &out)
	if !strings.Contains(out.String(), "skipped: none") || !strings.Contains(out.String(), "total: 0 passed, 0 failed, 0 skipped") {
		t.Errorf("summary = %q", out.String())
	}
}
