package e2e

import (
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
