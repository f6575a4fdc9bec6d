package roles_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// helperBudget is bcd-helper's size budget: 5 MiB, static and stripped,
// with every operation it has (docs/decisions.md, "the helper's size").
const helperBudget = 5 << 20

// TestHelperSize builds bcd-helper as make build does (CGO_ENABLED=0,
// -trimpath, -ldflags '-s -w' and the Makefile's HELPER_GOFLAGS) and
// fails when it is over its budget. A package that drags in reflection,
// net/http, x509 or a large parser shows here first; `make sizes` names
// the packages that take the most.
func TestHelperSize(t *testing.T) {
	flags := helperGoflags(t)
	out := filepath.Join(t.TempDir(), "bcd-helper")
	args := append([]string{"build", "-trimpath", "-ldflags", "-s -w"}, flags...)
	cmd := exec.Command("go", append(args, "-o", out, "./roles/helper")...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build bcd-helper: %v\n%s", err, b)
	}
	st, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bcd-helper: %d bytes (%s of the %d-byte budget; flags %q)", st.Size(), percent(st.Size(), helperBudget), helperBudget, flags)
	if st.Size() > helperBudget {
		t.Errorf("bcd-helper is %d bytes, over its budget of %d (5 MiB) by %d: see which packages grew with `make sizes`",
			st.Size(), helperBudget, st.Size()-helperBudget)
	}
}

// helperGoflags reads HELPER_GOFLAGS from the Makefile, so the test builds
// with the flags make build uses.
func helperGoflags(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^HELPER_GOFLAGS\s*:=\s*(.*)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Makefile has no HELPER_GOFLAGS line")
	}
	return strings.Fields(string(m[1]))
}

func percent(n, of int64) string { return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of)) }
