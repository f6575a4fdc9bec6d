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
	// b is refused busy; its redial waits the pushback, spread over half
	// of it again (a failover's refused agents do not all come back at once).
	m := b.waitLog(t, "session ended; redialing", 30*time.Second)
	s, _ := m["retry_in"].(string)
	wait, err := time.ParseDuration(s)
	if err != nil || wait < 3*time.Second || wait > 4500*time.Millisecond || !strings.Contains(m["err"].(string), "resource_exhausted") {
		t.Fatalf("busy refusal logged %v, want retry_in within 3s..4.5s and resource_exhausted", m)
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

// TestCancel: bcgw cancel ends a running command CANCELLED; a command
// the agent has not received yet ends CANCELLED without running.
func TestCancel(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1")
	cfg, id := l.joinNode(g, "n", tok, "node")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	out := l.bcgw(g, "run", id, "fakehw.mark", "--body", `{"sleep_ms":60000}`)
	var c struct{ ID, State, Status, Error string }
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatal(err)
	}
	node.waitLog(t, "command started", 10*time.Second)
	l.bcgw(g, "cancel", c.ID, "--reason", "operator changed their mind")
	code, out, _ := l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", g.dataDir)
	if code != 0 {
		t.Fatalf("ping: %s", out)
	}
	end := time.Now().Add(20 * time.Second)
	for c.State != "done" && time.Now().Before(end) {
		time.Sleep(100 * time.Millisecond)
		_ = json.Unmarshal([]byte(l.bcgw(g, "cancel", c.ID)), &c) // cancelling again changes nothing
	}
	if c.Status != "CANCELLED" || c.Error != "operator changed their mind" {
		t.Fatalf("running command after cancel: %+v", c)
	}

	// Not delivered yet: the node is stopped.
	node.signal(syscall.SIGTERM)
	node.wait(t, 15*time.Second)
	l.waitNode(g, id, "disconnected", func(n nodeView) bool { return !n.Connected })
	if err := json.Unmarshal([]byte(l.bcgw(g, "run", id, "fakehw.mark")), &c); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(l.bcgw(g, "cancel", c.ID)), &c); err != nil {
		t.Fatal(err)
	}
	if c.State != "done" || c.Status != "CANCELLED" {
		t.Fatalf("undelivered command after cancel: %+v", c)
	}
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "reconnected", func(n nodeView) bool { return n.Connected })
	if code, _, _ := l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", g.dataDir); code != 0 {
		t.Fatal("ping after reconnect failed")
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(cfg), "data", "fakehw", "marks.log")); strings.Contains(string(b), c.ID) {
		t.Fatal("a command cancelled before delivery ran")
	}
}
