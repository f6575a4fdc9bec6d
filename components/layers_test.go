package components

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/better-compute/bcd/"

// allowed names, per domain, the other domains its packages may import
// (a domain may always import itself). It is the table of doc.go; a
// domain missing here fails the test, so a new folder must say where it
// stands.
var allowed = map[string][]string{
	"base":    {},
	"trust":   {"base"},
	"bcx":     {"base"},
	"helper":  {"base", "trust"},
	"agent":   {"base", "trust", "helper"},
	"machine": {"base", "trust", "helper", "agent"},
	"boot":    {"base", "trust", "agent"},
	"bmc":     {"base", "trust", "agent", "bcx"},
	"disk":    {"base", "trust", "helper", "agent", "machine", "boot"},
	"gateway": {"base", "trust", "boot"},
	"vm":      {"base", "trust", "helper", "agent"},
	"host":    {"base", "trust", "helper", "agent"},
}

// shared is what any component may import outside components/.
var shared = []string{module + "proto/gen/"}

// domainOf returns the domain of a package path under components/, and
// false for a path outside components/ or components itself.
func domainOf(pkg string) (string, bool) {
	rest, ok := strings.CutPrefix(pkg, module+"components/")
	if !ok {
		return "", false
	}
	d, _, _ := strings.Cut(rest, "/")
	return d, true
}

// imports lists each package under components/ with its direct imports
// (not its tests'), for the given build tags on linux/amd64.
func imports(t *testing.T, tags string) map[string][]string {
	t.Helper()
	args := []string{"list", "-e", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./components/...: %v", err)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		m[f[0]] = f[1:]
	}
	return m
}

// check returns what is wrong with one package's imports, as lines.
func check(pkg string, deps []string) []string {
	from, ok := domainOf(pkg)
	if !ok {
		return nil // components itself: only doc and this test
	}
	may, known := allowed[from]
	if !known {
		return []string{pkg + " is in components/" + from + ", a domain with no row in allowed (add it to doc.go and layers_test.go)"}
	}
	var bad []string
	for _, d := range deps {
		if !strings.HasPrefix(d, module) || slices.ContainsFunc(shared, func(p string) bool { return strings.HasPrefix(d, p) }) {
			continue
		}
		to, ok := domainOf(d)
		switch {
		case !ok:
			bad = append(bad, pkg+" imports "+d+": a component imports no role, command or test tier")
		case to != from && !slices.Contains(may, to):
			bad = append(bad, pkg+" ("+from+") imports "+d+" ("+to+"): "+from+" may import only "+strings.Join(may, ", "))
		}
	}
	return bad
}

// TestLayers checks that no component imports against the layers of
// doc.go, in host and fakehw builds.
func TestLayers(t *testing.T) {
	for _, tags := range []string{"", "fakehw"} {
		for pkg, deps := range imports(t, tags) {
			for _, b := range check(pkg, deps) {
				t.Errorf("tags %q: %s", tags, b)
			}
		}
	}
}

// TestLayersCheckFails shows the check is not vacuous: the edges that
// would break the layering are reported.
func TestLayersCheckFails(t *testing.T) {
	for _, c := range []struct{ pkg, dep string }{
		{"components/agent/session", "components/machine/inventory"},
		{"components/trust/tpm", "components/helper/wire"},
		{"components/machine/nodekinds", "components/boot/bootserver"},
		{"components/gateway", "components/agent/journal"},
		{"components/base/config", "components/trust/pki"},
		{"components/agent/agentcmd", "roles/node"},
		{"components/newdomain/x", "components/base/cli"},
	} {
		if len(check(module+c.pkg, []string{module + c.dep})) == 0 {
			t.Errorf("%s importing %s passes the check; it must not", c.pkg, c.dep)
		}
	}
	if b := check(module+"components/disk/ramdiskcmd", []string{module + "components/boot/bootparams", module + "proto/gen/bcd/v1", "fmt"}); len(b) != 0 {
		t.Errorf("an allowed edge is refused: %v", b)
	}
}

// TestEveryDomainHasDoc checks each domain folder has a doc.go and a row
// in allowed, and each row a folder.
func TestEveryDomainHasDoc(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		seen[e.Name()] = true
		if _, ok := allowed[e.Name()]; !ok {
			t.Errorf("components/%s has no row in allowed", e.Name())
		}
		if _, err := os.Stat(filepath.Join(e.Name(), "doc.go")); err != nil {
			t.Errorf("components/%s has no doc.go saying what the domain is and what it may import", e.Name())
		}
	}
	for d := range allowed {
		if !seen[d] {
			t.Errorf("allowed names %s, which is no folder of components/", d)
		}
	}
}
