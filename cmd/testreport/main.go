// Command testreport reads `go test -json` on standard input and prints
// what a person needs of it: each package's result line, the output of
// every failed test, and a count per tier. It records every skipped test
// with its reason in a file, and `testreport summary` prints them all at
// the end of `make test`, so no skip goes unseen (docs/testing.md).
//
//	go test -json ./... | testreport -skips FILE [-tier NAME] [-v]
//	testreport summary -skips FILE
//
// It exits 1 when a test or a package failed (a build failure included).
// Lines that are not JSON are printed as they are.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

// Skip is one skipped test as the skips file records it.
type Skip struct {
	Tier    string `json:"tier"`
	Package string `json:"package"`
	Test    string `json:"test"`
	Reason  string `json:"reason"`
}

// Totals are the counts of one run or of all.
type Totals struct {
	Tier    string `json:"tier"`
	Passed  int    `json:"passed"`
	Failed  int    `json:"failed"`
	Skipped int    `json:"skipped"`
}

const module = "github.com/better-compute/bcd/"

// tierOf names the tier of a package when -tier is not given.
func tierOf(pkg string) string {
	switch p := strings.TrimPrefix(pkg, module); {
	case p == "e2e" || strings.HasPrefix(p, "e2e/"):
		return "e2e"
	case p == "packaging-tests" || strings.HasPrefix(p, "packaging-tests/"):
		return "packaging"
	case p == "qemu-tests" || strings.HasPrefix(p, "qemu-tests/"):
		return "qemu"
	default:
		return "unit"
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "summary" {
		fs := flag.NewFlagSet("testreport summary", flag.ExitOnError)
		skips := fs.String("skips", "", "the file the runs recorded skips and totals in")
		fs.Parse(os.Args[2:])
		os.Exit(summary(*skips, os.Stdout))
	}
	fs := flag.NewFlagSet("testreport", flag.ExitOnError)
	skips := fs.String("skips", "", "append each skipped test and the totals here (JSON lines)")
	tier := fs.String("tier", "", "the tier of every package (default: by path: e2e, packaging, qemu, unit)")
	verbose := fs.Bool("v", false, "print every test's output as it comes (JSON log lines left out)")
	fs.Parse(os.Args[1:])
	r := &report{out: os.Stdout, tier: *tier, verbose: *verbose, buf: map[string][]string{}, totals: map[string]*Totals{}}
	if err := r.read(os.Stdin); err != nil {
		fmt.Fprintf(os.Stderr, "testreport: reading go test -json: %v\n", err)
		os.Exit(1)
	}
	r.printTotals()
	if *skips != "" {
		if err := r.record(*skips); err != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
			os.Exit(1)
		}
	}
	if r.failed {
		os.Exit(1)
	}
}

type report struct {
	out     io.Writer
	tier    string
	verbose bool
	// buf holds each running test's output, by package and test.
	buf    map[string][]string
	skips  []Skip
	totals map[string]*Totals
	failed bool
}

func (r *report) tierFor(pkg string) string {
	if r.tier != "" {
		return r.tier
	}
	return tierOf(pkg)
}

func (r *report) count(pkg string) *Totals {
	t := r.tierFor(pkg)
	if r.totals[t] == nil {
		r.totals[t] = &Totals{Tier: t}
	}
	return r.totals[t]
}

func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(r.out, "%s\n", line)
			continue
		}
		r.event(e)
	}
	return sc.Err()
}

func (r *report) event(e event) {
	key := e.Package + "\x00" + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(r.out, e.Output)
	case e.Action == "build-fail":
		r.failed = true
	case e.Test == "":
		// The package's own lines: ok, FAIL, "? [no test files]", panics.
		if e.Action == "output" && e.Output != "PASS\n" {
			fmt.Fprint(r.out, e.Output)
		}
		if e.Action == "fail" {
			r.failed = true
		}
	case e.Action == "output":
		if r.verbose {
			if strings.HasPrefix(strings.TrimSpace(e.Output), "{") {
				return
			}
			// Printed now, and kept for a skip's reason.
			fmt.Fprint(r.out, e.Output)
		}
		r.buf[key] = append(r.buf[key], e.Output)
	case e.Action == "pass":
		r.count(e.Package).Passed++
		delete(r.buf, key)
	case e.Action == "fail":
		r.count(e.Package).Failed++
		r.failed = true
		if !r.verbose { // verbose printed them as they came
			for _, l := range r.buf[key] {
				fmt.Fprint(r.out, l)
			}
		}
		delete(r.buf, key)
	case e.Action == "skip":
		r.count(e.Package).Skipped++
		r.skips = append(r.skips, Skip{Tier: r.tierFor(e.Package), Package: strings.TrimPrefix(e.Package, module), Test: e.Test, Reason: reason(r.buf[key])})
		delete(r.buf, key)
	}
}

// reason is what a skipped test said, without go test's framing lines.
func reason(lines []string) string {
	var out []string
	for _, l := range lines {
		s := strings.TrimSpace(l)
		if s == "" || strings.HasPrefix(s, "=== ") || strings.HasPrefix(s, "--- SKIP") || strings.HasPrefix(s, "{") {
			continue
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return "(no reason given)"
	}
	return strings.Join(out, " / ")
}

func (r *report) printTotals() {
	tiers := make([]string, 0, len(r.totals))
	for t := range r.totals {
		tiers = append(tiers, t)
	}
	sort.Strings(tiers)
	for _, t := range tiers {
		c := r.totals[t]
		fmt.Fprintf(r.out, "%s: %d passed, %d failed, %d skipped\n", t, c.Passed, c.Failed, c.Skipped)
	}
}

// record appends the skips and totals to path, one JSON object a line.
func (r *report) record(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	enc := json.NewEncoder(f)
	for _, s := range r.skips {
		enc.Encode(map[string]any{"skip": s})
	}
	for _, t := range r.totals {
		enc.Encode(map[string]any{"totals": t})
	}
	return f.Close()
}

// summary prints every skip the runs recorded, and the totals over all
// tiers as the closing line. It exits 1 when the file cannot be read.
func summary(path string, out io.Writer) int {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testreport summary: %v\n", err)
		return 1
	}
	var skips []Skip
	var all Totals
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		var rec struct {
			Skip   *Skip
			Totals *Totals
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			fmt.Fprintf(os.Stderr, "testreport summary: %s: %v\n", path, err)
			return 1
		}
		if rec.Skip != nil {
			skips = append(skips, *rec.Skip)
		}
		if rec.Totals != nil {
			all.Passed += rec.Totals.Passed
			all.Failed += rec.Totals.Failed
			all.Skipped += rec.Totals.Skipped
		}
	}
	fmt.Fprintln(out)
	if len(skips) == 0 {
		fmt.Fprintln(out, "skipped: none")
	} else {
		fmt.Fprintf(out, "skipped (%d), and why:\n", len(skips))
		for _, s := range skips {
			fmt.Fprintf(out, "  %-9s %s %s: %s\n", s.Tier, s.Package, s.Test, s.Reason)
		}
	}
	fmt.Fprintf(out, "total: %d passed, %d failed, %d skipped\n", all.Passed, all.Failed, all.Skipped)
	return 0
}
