package testenv

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// recorder stands in for a test, keeping whether it failed or skipped.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Fatalf(format string, args ...any) { r.failed = format; runtime.Goexit() }
func (r *recorder) Skip(args ...any)                  { r.skipped = "skip"; runtime.Goexit() }

// run calls f with a new recorder on a goroutine of its own, as a test
// runs (Fatalf and Skip end it), and returns the recorder.
func run(f func(r *recorder)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

func TestSkipFailsUnderCI(t *testing.T) {
	for _, c := range []struct {
		ci       string
		wantFail bool
	}{{"", false}, {"true", true}, {"1", true}, {"yes", true}} {
		t.Setenv("CI", c.ci)
		r := run(func(r *recorder) { Skip(r, "swtpm is not installed") })
		if (r.failed != "") != c.wantFail || (r.skipped != "") == c.wantFail {
			t.Errorf("CI=%q: failed %q skipped %q, want failed=%v", c.ci, r.failed, r.skipped, c.wantFail)
		}
		r = run(func(r *recorder) { NotApplicable(r, "another build covers it") })
		if r.failed != "" || r.skipped == "" {
			t.Errorf("CI=%q: NotApplicable failed %q skipped %q, want a skip", c.ci, r.failed, r.skipped)
		}
	}
}

func TestNeedTool(t *testing.T) {
	t.Setenv("CI", "true")
	r := run(func(r *recorder) { NeedTool(r, "no-such-tool-bcd", "nothing") })
	if r.failed == "" {
		t.Error("a missing tool under CI does not fail the test")
	}
	var p string
	r = run(func(r *recorder) { p = NeedTool(r, "sh", "dash") })
	if p == "" || r.failed != "" || r.skipped != "" {
		t.Errorf("NeedTool(sh) = %q, failed %q skipped %q", p, r.failed, r.skipped)
	}
}

// skipCall is a call of a Skip method; testenv's own are allowed.
var skipCall = regexp.MustCompile(`(\w+)\.(Skip|Skipf|SkipNow)\(`)

// rawSkip reports whether line calls testing's Skip itself.
func rawSkip(line string) bool {
	if strings.HasPrefix(strings.TrimSpace(line), "//") {
		return false
	}
	for _, m := range skipCall.FindAllStringSubmatch(line, -1) {
		if m[1] != "testenv" {
			return true
		}
	}
	return false
}

func TestRawSkip(t *testing.T) {
	for line, want := range map[string]bool{
		`	t.Skip("no swtpm")`:                 true,
		`	tb.Skipf("no %s", x)`:               true,
		`	t.SkipNow()`:                        true,
		`	testenv.Skip(t, "no swtpm")`:        false,
		`	// t.Skip("commented out")`:         false,
		`	uimage.WithSkipLDD(),`:              false,
		`	testenv.NeedRoot(t, "x"); t.Skip()`: true,
	} {
		if got := rawSkip(line); got != want {
			t.Errorf("rawSkip(%q) = %v, want %v", line, got, want)
		}
	}
}

// TestEverySkipGoesThroughTestenv fails for a test in the repository that
// skips by calling testing's Skip itself, since such a skip would pass
// under CI unseen.
func TestEverySkipGoesThroughTestenv(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the repository root is not %s: %v", root, err)
	}
	self, _ := filepath.Abs("testenv.go")
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "gen") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || p == self || p == filepath.Join(filepath.Dir(self), "testenv_test.go") {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			if l := sc.Text(); rawSkip(l) {
				rel, _ := filepath.Rel(root, p)
				t.Errorf("%s:%d skips without testenv (testenv.Skip, NeedRoot, NeedTool or NotApplicable): %s", rel, n, strings.TrimSpace(l))
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}
