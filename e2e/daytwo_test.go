package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNodeRmAndJoinTokens: bcgw token ls lists join tokens without their
// secrets, bcgw token rm makes one useless, and bcgw node rm revokes a
// running node (its agent exits) and forgets it.
func TestNodeRmAndJoinTokens(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0")
	tok1, tok2 := l.token(g, "--uses", "1"), l.token(g, "--uses", "2", "--site", "ams1")
	cfg, id := l.joinNode(g, "n", tok1, "node")
	var ts []struct {
		ID, Role, Site string
		Uses, Used     int
		Spent          bool
	}
	if err := json.Unmarshal([]byte(l.bcgw(g, "token", "ls", "--json")), &ts); err != nil || len(ts) != 2 {
		t.Fatalf("token ls: %+v %v", ts, err)
	}
	byUses := map[int]int{ts[0].Uses: 0, ts[1].Uses: 1}
	one, two := ts[byUses[1]], ts[byUses[2]]
	if !one.Spent || one.Used != 1 || two.Spent || two.Used != 0 || two.Site != "ams1" {
		t.Errorf("token ls: %+v", ts)
	}
	ls := l.bcgw(g, "token", "ls")
	for _, secret := range []string{tok1, tok2} {
		if strings.Contains(ls, secret) || strings.Contains(l.bcgw(g, "token", "ls", "--json"), secret) {
			t.Error("token ls shows a secret")
		}
	}
	if !strings.Contains(ls, two.ID) || !strings.Contains(ls, "usable") || !strings.Contains(ls, "spent") {
		t.Errorf("token ls:\n%s", ls)
	}
	l.bcgw(g, "token", "rm", two.ID)
	dir := filepath.Join(l.root, "m")
	pins := strings.Fields(l.bcgw(g, "well-known", "--pins"))
	code, _, errOut := l.run(tok2+"\n", nil, "bcd-node", append([]string{"join", "--config", filepath.Join(dir, "config.toml"),
		"--server", "https://" + g.addr, "--data-dir", filepath.Join(dir, "data"), "--role", "node"}, pins...)...)
	if code == 0 {
		t.Errorf("a join with a removed token succeeded")
	}
	if code, _, errOut := l.run("", nil, "bcgw", "token", "rm", two.ID, "--data-dir", gwDir); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("token rm again: exit %d %s", code, errOut)
	}
	_ = errOut

	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	l.runKind(g, id, "agent.ping", "")
	if out := l.bcgw(g, "node", "rm", id); strings.TrimSpace(out) != "removed node "+id {
		t.Errorf("node rm printed %q", out)
	}
	if c := node.wait(t, 30*time.Second); c == 0 {
		t.Errorf("the removed node's agent exited 0")
	}
	if ns := l.nodes(g); len(ns) != 0 {
		t.Errorf("nodes after rm: %+v", ns)
	}
	if code, _, errOut := l.run("", nil, "bcgw", "status", id, "--data-dir", gwDir); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("status of a removed node: exit %d %s", code, errOut)
	}
	// Started again, its certificate names a node no gateway knows.
	again := l.start("bcd-node", "node", "--config", cfg)
	if m := again.waitLog(t, "session ended; redialing", 30*time.Second); !strings.Contains(m["err"].(string), "unknown node "+id) {
		t.Errorf("the removed node's session: %v", m)
	}
}
