package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// TestInstanceUserDataThroughBcgw: an instance with user_data waits
// (RETRYING, naming the secret) until `bcgw secret set
// instance-user-data/<allocation>` sets it; then the node fetches it
// with a sealed SecretRequest bound to the allocation and writes it only
// into the instance's NoCloud seed. It is in no log, argv, spec, status
// or bcgw.db in clear; another allocation's instance cannot have it.
func TestInstanceUserDataThroughBcgw(t *testing.T) {
	l := newLab(t)
	digest, imageURL, pin := imageServer(t, l)
	image := `{"sha256":"` + digest + `","url":"` + imageURL + `","format":"qcow2","spki_pin":"` + pin + `"}`
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	const userData = "#cloud-config\nruncmd:\n  - echo e2e-user-data-s3cret-K9 > /dev/ttyS0\n"
	vm := `{"id":"vm-u","allocation":"alloc_u","state":"RUNNING","vcpus":1,"memory_mib":128,"image":"` + digest + `","user_data":true}`
	gen := l.spec(g, "set", id, `{"instances":{"images":[`+image+`],"instances":[`+vm+`]}}`)
	st := l.waitStatus(g, id, "instances RETRYING without the user data", func(s adminapi.StatusView) bool {
		return section(s, "instances").Generation == gen && section(s, "instances").State == "RETRYING"
	})
	if msg := section(st, "instances").Message; !strings.Contains(msg, "bcgw secret set instance-user-data/alloc_u") {
		t.Fatalf("instances without the user data: %q", msg)
	}
	vf := filepath.Join(l.root, "ud.yaml")
	if err := os.WriteFile(vf, []byte(userData), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := l.bcgw(g, "secret", "set", "instance-user-data/alloc_u", "--node", id, "--value-file", vf); !strings.Contains(out, "set instance-user-data/alloc_u for node "+id) {
		t.Fatalf("bcgw secret set: %q", out)
	}
	l.waitStatus(g, id, "instances CONVERGED", func(s adminapi.StatusView) bool { return section(s, "instances").State == "CONVERGED" })
	seedISO, err := os.ReadFile(filepath.Join(data, "instances", "vm-u", "seed.iso"))
	if err != nil {
		t.Fatal(err)
	}
	// bcgw secret set drops the file's final newline.
	if !strings.Contains(string(seedISO), strings.TrimSuffix(userData, "\n")) {
		t.Fatal("the seed does not carry the user data")
	}

	// Where the user data must not be.
	l.out.assertAbsent(t, "the user data", "s3cret-K9")
	l.out.mu.Lock()
	for _, b := range l.out.all {
		if strings.Contains(b.name, "s3cret") {
			t.Errorf("an argv holds the user data: %s", b.name)
		}
	}
	l.out.mu.Unlock()
	for what, s := range map[string]string{
		"bcgw spec get":    l.bcgw(g, "spec", "get", id),
		"bcgw status":      l.bcgw(g, "status", id, "--json"),
		"bcgw secret list": l.bcgw(g, "secret", "list", "--json"),
	} {
		if strings.Contains(s, "s3cret") {
			t.Errorf("%s shows the user data", what)
		}
	}
	for _, p := range []string{filepath.Join(data, "spec.json"), filepath.Join(g.dataDir, "bcgw.db")} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "s3cret") {
			t.Errorf("%s holds the user data in clear", p)
		}
	}
}
