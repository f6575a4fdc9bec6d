package gateway_test

import (
	"os/exec"
	"strings"
	"testing"
)

// rank orders the gateway's packages: a package may import only packages
// of a lower rank (docs/decisions.md, the gateway split by concern).
var rank = map[string]int{
	"gateway":  6,
	"admin":    5,
	"agentsvc": 4,
	"fleet":    3,
	"adminapi": 2,
	"hub":      1,
	"keys":     1,
	"kek":      0,
	"metrics":  0,
	"store":    0,
}

// TestPackagesImportOneWay: the wiring imports the admin API, which
// imports the agent service, which imports the fleet logic, which imports
// the hub, the keys and the store; never the other way.
func TestPackagesImportOneWay(t *testing.T) {
	const root = "github.com/better-compute/bcd/components/gateway"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	name := func(pkg string) (string, bool) {
		if pkg == root {
			return "gateway", true
		}
		rest, ok := strings.CutPrefix(pkg, root+"/")
		if !ok {
			return "", false
		}
		top, _, _ := strings.Cut(rest, "/")
		return top, true
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		from, _ := name(f[0])
		r, known := rank[from]
		if !known {
			t.Errorf("%s has no rank: add it to rank and to docs/architecture.md", f[0])
			continue
		}
		for _, dep := range f[1:] {
			to, ok := name(dep)
			if ok && to != from && rank[to] >= r {
				t.Errorf("%s imports %s: the gateway's packages import only downward (%s %d, %s %d)", f[0], dep, from, r, to, rank[to])
			}
		}
	}
}
