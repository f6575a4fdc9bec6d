package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSpine: bcgw serve, bcd join with the token on stdin, bcd node
// (fakehw) connected with its role and site; a command round trip; bcgw
// killed and restarted: the node reconnects with a higher epoch; revoke:
// the node exits 1 with the revoked message; no token in any output.
func TestSpine(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0")
	tok := l.token(g, "--uses", "1", "--site", "fsn1")
	if !strings.HasPrefix(tok, "bcjt_") {
		t.Fatalf("token create printed %q", tok)
	}
	cfg, id := l.joinNode(g, "n1", tok, "node")

	// Files as the commands page says.
	dir := filepath.Dir(cfg)
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{
		{cfg, 0o600},
		{filepath.Join(dir, "join-encryption.jwk"), 0o644},
		{filepath.Join(dir, "data", "node.key"), 0o600},
		{filepath.Join(dir, "data", "identity.json"), 0o600},
	} {
		st, err := os.Stat(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != f.mode {
			t.Errorf("%s: mode %04o, want %04o", f.path, st.Mode().Perm(), f.mode)
		}
	}

	// Joining again needs no token.
	code, out, errOut := l.run("", nil, "bcd-node", "join", "--config", cfg)
	if code != 0 || out != "already joined as "+id+" (site fsn1, role node)\n" {
		t.Fatalf("second join: exit %d, %q %q", code, out, errOut)
	}

	node := l.start("bcd-node", "node", "--config", cfg)
	n := l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	if n.Role != "node" || n.Site != "fsn1" {
		t.Fatalf("node view %+v, want role node site fsn1", n)
	}
	epoch1 := n.Epoch

	// A command round trip, and an unsupported kind.
	var res struct {
		State, Status, Error string
		Output               map[string]any
	}
	code, out, errOut = l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", gwDir)
	if code != 0 {
		t.Fatalf("bcgw run agent.ping: exit %d: %s %s", code, out, errOut)
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != "SUCCEEDED" || res.Output["node_id"] != id || res.Output["role"] != "node" {
		t.Fatalf("agent.ping result %+v", res)
	}
	code, out, _ = l.run("", nil, "bcgw", "run", id, "no.such-kind", "--wait", "--data-dir", gwDir)
	if code != 1 || !strings.Contains(out, `"UNSUPPORTED"`) {
		t.Fatalf("unsupported kind: exit %d: %s", code, out)
	}

	// bcgw killed and started again on the same data dir and address.
	g.signal(syscall.SIGKILL)
	g.wait(t, 10*time.Second)
	g = l.startGateway(gwDir, g.addr)
	n = l.waitNode(g, id, "reconnected", func(n nodeView) bool { return n.Connected })
	if n.Epoch <= epoch1 {
		t.Fatalf("epoch after restart %d, want > %d", n.Epoch, epoch1)
	}
	// Commands still round-trip over the new session.
	if code, out, _ := l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", gwDir); code != 0 {
		t.Fatalf("agent.ping after restart: exit %d: %s", code, out)
	}

	// Revocation ends the agent with exit 1 and the message docs/protocol.md gives.
	l.bcgw(g, "revoke", id)
	if code := node.wait(t, 30*time.Second); code != 1 {
		t.Fatalf("revoked node exited %d, want 1", code)
	}
	if !strings.Contains(node.stderr.String(), "agent: this node's certificate was revoked\n") {
		t.Fatalf("revoked node stderr lacks the revoked message:\n%s", node.stderr.String())
	}
	// A revoked node that starts again is told at once.
	again := l.start("bcd-node", "node", "--config", cfg)
	if code := again.wait(t, 30*time.Second); code != 1 {
		t.Fatalf("revoked node restarted: exit %d, want 1", code)
	}

	l.out.assertAbsent(t, "the join token", tok)
	l.out.assertAbsent(t, "the join token's secret", tok[strings.LastIndex(tok, "_")+1:])
}

// TestNodeStopsOnSignal: SIGTERM and SIGINT end bcd node with exit 0.
func TestNodeStopsOnSignal(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "2")
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cfg, id := l.joinNode(g, "n"+string(rune('a'+i)), tok, "node")
		p := l.start("bcd-node", "node", "--config", cfg)
		l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
		p.signal(sig)
		if code := p.wait(t, 15*time.Second); code != 0 {
			t.Fatalf("%v: exit %d, want 0", sig, code)
		}
	}
	l.out.assertAbsent(t, "the join token", tok)
}

// TestRenewal: with BCD_RENEW_AFTER the node renews its certificate over
// mTLS with a new key, stores it, reconnects with it, and still connects
// with it after a restart.
func TestRenewal(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1")
	cfg, id := l.joinNode(g, "n", tok, "node")
	keyPath := filepath.Join(filepath.Dir(cfg), "data", "node.key")
	key1, _ := os.ReadFile(keyPath)
	idPath := filepath.Join(filepath.Dir(cfg), "data", "identity.json")
	id1, _ := os.ReadFile(idPath)

	node := l.startEnv([]string{"BCD_RENEW_AFTER=500ms"}, "bcd-node", "node", "--config", cfg)
	node.waitLog(t, "certificate renewed", 30*time.Second)
	n := l.waitNode(g, id, "reconnected after renewal", func(n nodeView) bool { return n.Connected && n.Epoch >= 2 })
	key2, _ := os.ReadFile(keyPath)
	id2, _ := os.ReadFile(idPath)
	if string(key1) == string(key2) || string(id1) == string(id2) {
		t.Fatal("renewal did not store a new key and certificate")
	}
	if code, out, _ := l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", g.dataDir); code != 0 {
		t.Fatalf("agent.ping after renewal: exit %d %s", code, out)
	}
	node.signal(syscall.SIGTERM)
	node.wait(t, 15*time.Second)
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected with the renewed certificate after a restart", func(x nodeView) bool { return x.Connected && x.Epoch > n.Epoch })
}
