// Package testenv is how a test says it cannot run here. Every skip in
// this repository goes through it (TestEverySkipGoesThroughTestenv), so
// the rule of docs/testing.md holds in one place:
//
//   - Skip, NeedRoot and NeedTool are for what the machine lacks (a tool,
//     root, a device). Under CI (the CI variable set to anything) they
//     fail the test instead: CI installs every tool and runs as root, so a
//     missing one there is a defect, not a reason to pass.
//   - NotApplicable is for a test that does not apply by design (another
//     platform, -short, a case another build covers). It skips everywhere.
//
// `make test` lists every skip with its reason at the end (cmd/testreport).
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the tests run under CI: CI set to anything non-empty.
func CI() bool { return os.Getenv("CI") != "" }

// Skip skips t because the machine lacks something the test needs, which
// the reason names with how to get it; under CI it fails t instead.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("CANNOT RUN under CI=%s: %s", os.Getenv("CI"), why)
	}
	t.Skip("SKIPPED: " + why)
}

// NeedRoot skips t (fails it under CI) unless the test runs as root; why
// says what needs root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root: %s (CI runs as root)", why)
	}
}

// NeedTool returns the path of tool, or skips t (fails it under CI)
// naming the Debian package that installs it.
func NeedTool(t testing.TB, tool, debianPackage string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		Skip(t, "%s is not installed (apt-get install %s; build/deps.sh does)", tool, debianPackage)
	}
	return p
}

// NotApplicable skips t everywhere, CI included: the test does not apply
// here by design, and why says where the case is covered instead.
func NotApplicable(t testing.TB, why string) {
	t.Helper()
	t.Skip("NOT APPLICABLE: " + why)
}
