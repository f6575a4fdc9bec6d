// Package roles_test holds the checks every role binary must pass: its
// dependency list matches the checked-in roles/<role>/deps.txt, it never
// links what its role must not, and it builds static.
package roles_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var roleNames = []string{"node", "site", "ramdisk", "helper"}

const bcd = "github.com/better-compute/bcd/components/"

// forbidden names, per role, the import path prefixes it must never link
// and why. Every prefix must match a package that exists
// (TestRulesNameRealPackages), so a rule cannot rot when a package moves:
// a rule for a package still to be written comes with that package.
var forbidden = map[string]map[string]string{
	"helper": {
		"net/http":                      "the root half parses only its own small JSON",
		"connectrpc.com/connect":        "the root half speaks no RPC",
		"google.golang.org/protobuf":    "the root half parses no protobuf",
		"go.etcd.io/bbolt":              "the helper keeps no journal",
		"github.com/go-jose/go-jose/v4": "the helper handles no join",
		"crypto/x509":                   "the root half verifies no certificates (EK certificates are bcgw's: components/trust/tpm/ekcert)",
		bcd + "agent":                   "the helper runs no session: it serves the node, it does not talk to the gateway",
		bcd + "helper/helperclient":     "the helper does not call itself",
		bcd + "trust/tpm/ekcert":        "EK certificates are verified by bcgw",
		bcd + "trust/tpm/ek":            "the EK and credential activation are bcd join's, not the helper's",
		"github.com/google/go-tpm":      "go-tpm's reflection marshalling and sessions cost the helper about 370 kB; components/trust/tpm frames its commands (docs/decisions.md)",
		bcd + "machine/nodekinds":       "the node's kinds run in the node, not as root",
		bcd + "host/section":            "the host section's engine runs in the node; root links only the units (host/unit)",
		bcd + "boot":                    "the helper boots no machine",
		bcd + "disk":                    "the helper wipes and writes no disk",
		bcd + "bmc":                     "the helper drives no BMC",
		bcd + "bcx":                     "the helper hosts no plugin",
		bcd + "vm/images":               "base images are fetched by the node; the helper only checks their headers (vm/qcow2)",
		bcd + "vm/instances":            "the instances section converges in the node; the helper renders domains (vm/domainxml)",
		bcd + "vm/spec":                 "the helper takes typed requests, never the node's spec",
	},
	"node": {
		bcd + "boot/bootserver":   "the boot server is the site's",
		bcd + "boot/imagecache":   "the image cache is the site's",
		bcd + "boot/sitekinds":    "the boot.* kinds are the site's",
		bcd + "boot/proxydhcp":    "the site answers PXE",
		bcd + "boot/tftpd":        "the site answers PXE",
		bcd + "boot":              "the boot domain is the site's and the ramdisk's",
		bcd + "bmc":               "BMCs are driven by the site",
		bcd + "disk/ramdiskcmd":   "bcd ramdisk is the ramdisk's",
		bcd + "disk/ramdiskkinds": "disk.wipe and deploy.image run in the ramdisk, never on a node in service",
		bcd + "machine/fakekinds": "test kinds are for fakehw builds only",
	},
	"site": {
		bcd + "vm":                "VMs run on nodes, never on the site agent",
		bcd + "host":              "the host section configures nodes, never the site agent's machine",
		bcd + "disk":              "disk work is the ramdisk's",
		bcd + "machine/nodekinds": "the node's kinds are the node's",
		bcd + "machine/fakekinds": "test kinds are for fakehw builds only",
	},
	"ramdisk": {
		bcd + "vm":                "the ramdisk runs no VM",
		bcd + "host":              "the ramdisk configures no host: it wipes and deploys",
		bcd + "boot/bootserver":   "the ramdisk is booted, it does not boot others",
		bcd + "boot/imagecache":   "the ramdisk reads the site's cache over HTTP, it keeps none",
		bcd + "boot/sitekinds":    "the boot.* kinds are the site's",
		bcd + "boot/proxydhcp":    "the ramdisk answers no PXE",
		bcd + "boot/tftpd":        "the ramdisk answers no PXE",
		bcd + "bmc":               "the ramdisk drives no BMC",
		bcd + "machine/nodekinds": "the node's kinds are the node's",
		bcd + "machine/fakekinds": "test kinds are for fakehw builds only",
	},
}

// forbiddenEverywhere is what no role may link.
var forbiddenEverywhere = map[string]string{
	"testing":                       "test code stays out of role binaries",
	"net/http/httptest":             "test servers stay out of role binaries",
	bcd + "bmc/redfish/redfishtest": "the test BMC stays out of role binaries",
	bcd + "bcx/ipmisim":             "the test BMC stays out of role binaries",
	bcd + "trust/tpm/swtpmtest":     "the test TPM stays out of role binaries",
	bcd + "gateway":                 "the gateway is bcgw's",
}

// absentModules are modules no role may link, kept out of the module
// graph as a whole (TestModuleGraph): they are not in it, so no package
// of theirs exists here for a forbidden rule to name.
var absentModules = map[string]string{
	"google.golang.org/grpc":         "bcd speaks gRPC through connect-go",
	"github.com/hashicorp/go-plugin": "the bcx plugin host has its own handshake",
}

// platforms are the GOOS/GOARCH pairs every role is checked for.
var platforms = [][2]string{{"linux", "amd64"}, {"linux", "arm64"}}

func goList(t *testing.T, role string, tags ...string) []string {
	t.Helper()
	return goListFor(t, platforms[0], role, tags...)
}

func goListFor(t *testing.T, platform [2]string, role string, tags ...string) []string {
	t.Helper()
	args := []string{"list", "-deps"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, "./roles/"+role)...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+platform[0], "GOARCH="+platform[1])
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./roles/%s (%s/%s): %v", role, platform[0], platform[1], err)
	}
	return strings.Fields(string(out))
}

func TestDepsListsAreCurrent(t *testing.T) {
	for _, role := range roleNames {
		got := goList(t, role)
		b, err := os.ReadFile(filepath.Join(role, "deps.txt"))
		if err != nil {
			t.Errorf("%s: %v (run make deps-lists)", role, err)
			continue
		}
		want := strings.Fields(string(b))
		g, w := set(got), set(want)
		for p := range g {
			if !w[p] {
				t.Errorf("%s now links %s, which roles/%s/deps.txt does not list: if it belongs there, run make deps-lists and commit", role, p, role)
			}
		}
		for p := range w {
			if !g[p] {
				t.Errorf("%s no longer links %s: run make deps-lists and commit", role, p)
			}
		}
	}
}

// TestRolesNeverLinkForbidden checks release builds and fakehw builds
// (the test builds must keep the same shape: a fakehw helper that linked
// net/http would hide what the real one must not do), fakehw builds
// excepted only from the fakekinds rule, for every platform.
func TestRolesNeverLinkForbidden(t *testing.T) {
	for _, platform := range platforms {
		for _, tags := range [][]string{nil, {"fakehw"}} {
			for _, role := range roleNames {
				for _, bad := range violations(role, len(tags) > 0, goListFor(t, platform, role, tags...)) {
					t.Errorf("%s/%s tags %v: %s", platform[0], platform[1], tags, bad)
				}
			}
		}
	}
}

// violations lists what deps (a role's go list -deps) links against its
// rules, one line each.
func violations(role string, fakehw bool, deps []string) []string {
	rules := map[string]string{}
	for k, v := range forbidden[role] {
		if fakehw && strings.HasSuffix(k, "/fakekinds") {
			continue
		}
		rules[k] = v
	}
	for k, v := range forbiddenEverywhere {
		rules[k] = v
	}
	var out []string
	for _, p := range deps {
		for prefix, why := range rules {
			if matches(p, prefix) {
				out = append(out, role+" links "+p+": it must not ("+why+")")
			}
		}
	}
	return out
}

func matches(pkg, prefix string) bool { return pkg == prefix || strings.HasPrefix(pkg, prefix+"/") }

// TestRulesNameRealPackages fails for a rule whose prefix matches no
// package of the standard library, this module or its module graph.
func TestRulesNameRealPackages(t *testing.T) {
	rules := map[string]bool{}
	for _, r := range forbidden {
		for k := range r {
			rules[k] = true
		}
	}
	for k := range forbiddenEverywhere {
		rules[k] = true
	}
	for _, missing := range missingRules(t, rules) {
		t.Errorf("a forbidden rule names %s, which matches no package: rename it to where the package is now, or drop it", missing)
	}
}

// missingRules returns the rules that match no package, with one go list.
func missingRules(t *testing.T, rules map[string]bool) []string {
	t.Helper()
	args := []string{"list", "-e", "-f", "{{if not .Error}}{{.ImportPath}}{{end}}"}
	for k := range rules {
		args = append(args, k, k+"/...")
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list the rules: %v", err)
	}
	found := strings.Fields(string(out))
	var missing []string
	for k := range rules {
		ok := false
		for _, p := range found {
			if matches(p, k) {
				ok = true
				break
			}
		}
		if !ok {
			missing = append(missing, k)
		}
	}
	return missing
}

// TestRuleChecksCanFail shows both checks are not vacuous: a node that
// links the proxy DHCP server breaks its rules, and a rule for a package
// that does not exist is found.
func TestRuleChecksCanFail(t *testing.T) {
	if len(violations("node", false, []string{bcd + "boot/proxydhcp"})) == 0 {
		t.Error("a node linking proxydhcp passes its rules")
	}
	if len(violations("site", false, []string{bcd + "disk/wipe"})) == 0 {
		t.Error("a site linking the disk domain passes its rules")
	}
	if len(violations("node", true, []string{bcd + "machine/fakekinds"})) != 0 {
		t.Error("a fakehw node may link fakekinds")
	}
	got := missingRules(t, map[string]bool{bcd + "runtime": true, bcd + "boot/proxydhcp": true})
	if len(got) != 1 || got[0] != bcd+"runtime" {
		t.Errorf("missingRules = %v, want only the package that does not exist", got)
	}
}

// TestModuleGraph keeps absentModules out of the module graph.
func TestModuleGraph(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "all")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m all: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		mod, _, _ := strings.Cut(line, " ")
		if why, ok := absentModules[mod]; ok {
			t.Errorf("the module graph holds %s: it must not (%s)", mod, why)
		}
	}
}

func set(ss []string) map[string]bool {
	m := map[string]bool{}
	for _, s := range ss {
		m[s] = true
	}
	return m
}

// TestBuildsStatic builds each role as make build does and checks the
// binary has no program interpreter (no dynamic loader).
func TestBuildsStatic(t *testing.T) {
	dir := t.TempDir()
	for _, role := range roleNames {
		out := filepath.Join(dir, "bcd-"+role)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "./roles/"+role)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", role, err, b)
		}
		f, err := elf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("bcd-%s is dynamically linked", role)
			}
		}
		f.Close()
	}
}
