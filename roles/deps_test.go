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

// forbidden names, per role, the import path prefixes it must never link
// and why.
var forbidden = map[string]map[string]string{
	"helper": {
		"net/http":                                         "the root half parses only its own small JSON",
		"connectrpc.com/connect":                           "the root half speaks no RPC",
		"google.golang.org/protobuf":                       "the root half parses no protobuf",
		"google.golang.org/grpc":                           "the root half speaks no RPC",
		"go.etcd.io/bbolt":                                 "the helper keeps no journal",
		"github.com/go-jose/go-jose":                       "the helper handles no join",
		"github.com/better-compute/bcd/components/gateway": "the gateway is bcgw's",
		"crypto/x509":                                      "the root half verifies no certificates (EK certificates are bcgw's: components/trust/tpm/ekcert)",
	},
	"node": {
		"github.com/better-compute/bcd/components/boot/bootserver":   "the boot server is the site's",
		"github.com/better-compute/bcd/components/bmc/redfish":       "BMCs are driven by the site",
		"github.com/better-compute/bcd/components/ipmi":              "BMCs are driven by the site",
		"github.com/better-compute/bcd/components/gateway":           "the gateway is bcgw's",
		"github.com/better-compute/bcd/components/machine/fakekinds": "test kinds are for fakehw builds only",
	},
	"site": {
		"github.com/better-compute/bcd/components/runtime":    "instance runtimes are the node's",
		"github.com/better-compute/bcd/components/kubernetes": "Kubernetes is the node's",
		"github.com/better-compute/bcd/components/hostconfig": "host units are the node's",
		"google.golang.org/grpc":                              "the bcx plugin host speaks gRPC through connect-go",
		"github.com/hashicorp/go-plugin":                      "the bcx plugin host has its own handshake",
		"github.com/better-compute/bcd/components/gateway":    "the gateway is bcgw's",
	},
	"ramdisk": {
		"github.com/better-compute/bcd/components/boot/bootserver": "the ramdisk is booted, it does not boot others",
		"github.com/better-compute/bcd/components/bmc/redfish":     "the ramdisk drives no BMC",
		"github.com/better-compute/bcd/components/runtime":         "the ramdisk runs no instances",
		"github.com/better-compute/bcd/components/kubernetes":      "the ramdisk joins no cluster",
		"github.com/better-compute/bcd/components/selfupdate":      "the ramdisk never updates itself",
		"github.com/better-compute/bcd/components/gateway":         "the gateway is bcgw's",
	},
}

// forbiddenEverywhere is what no role may link.
var forbiddenEverywhere = map[string]string{
	"testing":           "test code stays out of role binaries",
	"net/http/httptest": "test servers stay out of role binaries",
	"github.com/better-compute/bcd/components/bmc/redfish/redfishtest": "the test BMC stays out of role binaries",
}

func goList(t *testing.T, role string, tags ...string) []string {
	t.Helper()
	args := []string{"list", "-deps"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, "./roles/"+role)...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./roles/%s: %v", role, err)
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
// excepted only from the fakekinds rule.
func TestRolesNeverLinkForbidden(t *testing.T) {
	for _, tags := range [][]string{nil, {"fakehw"}} {
		for _, role := range roleNames {
			rules := map[string]string{}
			for k, v := range forbidden[role] {
				if len(tags) > 0 && strings.HasSuffix(k, "/fakekinds") {
					continue
				}
				rules[k] = v
			}
			for k, v := range forbiddenEverywhere {
				rules[k] = v
			}
			for _, p := range goList(t, role, tags...) {
				for prefix, why := range rules {
					if p == prefix || strings.HasPrefix(p, prefix+"/") {
						t.Errorf("%s (tags %v) links %s: it must not (%s)", role, tags, p, why)
					}
				}
			}
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
