package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// TestKEKRotation: bcgw kek rotate reseals a database's keys and operator
// secrets under a new key-encryption key with 3 connected nodes: commands
// run meanwhile, the gateway not yet restarted refuses to seal a secret
// under the old key, a start with the old key is refused, and after a
// restart with the new one the nodes come back without joining again
// and commands run.
func TestKEKRotation(t *testing.T) {
	c := pgtest.StartT(t)
	url, err := c.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t)
	dbFile := filepath.Join(l.root, "database.url")
	if err := os.WriteFile(dbFile, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	oldKEK := l.kekFile()
	newKEK := filepath.Join(l.root, "bcgw-2.kek")
	if code, _, errOut := l.run("", nil, "bcgw", "kek", "generate", "--out", newKEK); code != 0 {
		t.Fatalf("kek generate: %s", errOut)
	}
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0", "--database-file", dbFile, "--key-encryption-key", oldKEK)
	ids := l.threeNodes(g)
	value := filepath.Join(l.root, "value")
	if err := os.WriteFile(value, []byte("Bearer s3cret-header\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l.bcgw(g, "secret", "set", "telemetry-header/Authorization", "--value-file", value)

	rotate := func() (int, string, string) {
		return l.run("", nil, "bcgw", "kek", "rotate", "--database-file", dbFile, "--key-encryption-key", oldKEK, "--new", newKEK, "--json")
	}
	code, out, errOut := rotate()
	if code != 0 || !strings.Contains(out, `"keys": 10`) || !strings.Contains(out, `"secrets": 1`) {
		t.Fatalf("kek rotate: exit %d %s %s", code, out, errOut)
	}
	if code, _, errOut := rotate(); code == 0 || !strings.Contains(errOut, "already") {
		t.Errorf("a second rotation from the old key: exit %d %s", code, errOut)
	}
	l.pingAll(g, ids, "after the rotation, before the restart")
	code, _, errOut = l.run("", nil, "bcgw", "secret", "set", "telemetry-header/X-Other", "--value-file", value, "--data-dir", gwDir)
	if code == 0 || !strings.Contains(errOut, "restart it with the new one") {
		t.Errorf("a secret set on the gateway with the old key: exit %d %s", code, errOut)
	}

	addr := g.addr
	g.signal(syscall.SIGTERM)
	g.wait(t, 15*time.Second)
	code, _, errOut = l.run("", nil, "bcgw", "serve", "--data-dir", gwDir, "--listen", "127.0.0.1:0", "--database-file", dbFile, "--key-encryption-key", oldKEK)
	if code == 0 || !strings.Contains(errOut, "sealed under key-encryption key") {
		t.Errorf("a start with the old key: exit %d %s", code, errOut)
	}
	g = l.startGateway(gwDir, addr, "--database-file", dbFile, "--key-encryption-key", newKEK)
	for _, id := range ids {
		l.waitNode(g, id, "connected again", func(n nodeView) bool { return n.Connected })
	}
	l.pingAll(g, ids, "after the restart with the new key")
	l.bcgw(g, "secret", "set", "telemetry-header/X-Other", "--value-file", value)
	if n := len(l.nodes(g)); n != 3 || strings.Contains(g.stderr.String(), `"msg":"node joined"`) {
		t.Errorf("%d nodes; a node joined again: %v", n, strings.Contains(g.stderr.String(), `"msg":"node joined"`))
	}
}
