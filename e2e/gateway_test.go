package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDrainAndBusy: a gateway stopped with SIGTERM drains its sessions
// (the agents are told, and redial by themselves when it is back); a
// gateway at its session limit refuses with a pushback the agent honours.
func TestDrainAndBusy(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0", "--max-sessions", "1", "--pushback", "3s")
	tok := l.token(g, "--uses", "2")
	cfgA, idA := l.joinNode(g, "a", tok, "node")
	cfgB, idB := l.joinNode(g, "b", tok, "node")

	a := l.start("bcd-node", "node", "--config", cfgA)
	l.waitNode(g, idA, "connected", func(n nodeView) bool { return n.Connected })
	b := l.start("bcd-node", "node", "--config", cfgB)
	// b is refused busy; its redial waits exactly the pushback.
	m := b.waitLog(t, "session ended; redialing", 30*time.Second)
	if m["retry_in"] != "3s" || !strings.Contains(m["err"].(string), "resource_exhausted") {
		t.Fatalf("busy refusal logged %v, want retry_in 3s and resource_exhausted", m)
	}
	for _, n := range l.nodes(g) {
		if n.ID == idB && n.Connected {
			t.Fatal("a second session was accepted past --max-sessions 1")
		}
	}

	// SIGTERM: bcgw exits 0 after telling a to drain.
	g.signal(syscall.SIGTERM)
	if code := g.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("bcgw after SIGTERM: exit %d", code)
	}
	a.waitLog(t, "gateway asked to drain", 10*time.Second)
	g = l.startGateway(gwDir, g.addr)
	l.waitNode(g, idA, "reconnected after the drain", func(n nodeView) bool { return n.Connected && n.Epoch >= 2 })
	// Without the limit both are in.
	l.waitNode(g, idB, "connected without a limit", func(n nodeView) bool { return n.Connected })
	l.out.assertAbsent(t, "the join token", tok)
}

// TestAdminOverLoopback: the admin API on a loopback listener needs the
// bearer token from DATA/admin.token.
func TestAdminOverLoopback(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	url := g.waitLog(t, "bcgw serving", time.Second)["admin_url"].(string)
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("admin_url %q", url)
	}
	tokFile := filepath.Join(gwDir, "admin.token")
	code, out, errOut := l.run("", nil, "bcgw", "nodes", "--json", "--admin", url, "--admin-token-file", tokFile)
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("nodes with the bearer: exit %d, %q %q", code, out, errOut)
	}
	wrong := filepath.Join(l.root, "wrong")
	if err := os.WriteFile(wrong, []byte("not-the-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = l.run("", nil, "bcgw", "nodes", "--admin", url, "--admin-token-file", wrong)
	if code != 1 || !strings.Contains(errOut, "bearer token required") {
		t.Fatalf("nodes with a wrong bearer: exit %d, %q", code, errOut)
	}
}
