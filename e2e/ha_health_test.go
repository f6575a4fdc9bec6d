package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// TestGatewayLosingItsDatabaseLeavesRotation: two bcgw behind HAProxy,
// each reaching PostgreSQL through a proxy of its own. The database is
// taken away from the gateway holding the node's session (the other keeps
// it): that gateway's /readyz answers 503, HAProxy's health check marks it
// down and ends its sessions, and the node reconnects through HAProxy to
// the other gateway, where a command reaches it. `bcgw health` on the cut
// gateway exits 1 naming the database; when the database comes back it
// answers again.
func TestGatewayLosingItsDatabaseLeavesRotation(t *testing.T) {
	h := newHALab(t, 2)
	// Restart each gateway with its database through its own proxy.
	proxies := make([]*pgtest.Proxy, 2)
	orig := h.dbFile
	for i := range h.gws {
		h.gws[i].signal(syscall.SIGTERM)
		h.gws[i].wait(t, 15*time.Second)
		p, u := pgtest.NewProxy(t, h.url)
		proxies[i] = p
		h.dbFile = filepath.Join(h.root, "database"+string(rune('1'+i))+".url")
		if err := os.WriteFile(h.dbFile, []byte(u+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		h.startGW(i)
	}
	h.dbFile = orig

	cfg, id := h.joinNode(h.front(0), "n", h.token(h.gws[0], "--uses", "1"), "node")
	node := h.start("bcd-node", "node", "--config", cfg)
	hold := h.waitHolder(id)
	other := 1 - hold

	proxies[hold].Cut()
	cut := time.Now()
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		end := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 60s of gw%d losing its database\nhaproxy:\n%s", what, hold+1, h.haproxy.stderr.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("%s %s after the cut", what, time.Since(cut).Round(10*time.Millisecond))
	}
	var out string
	waitUntil("bcgw health says unreachable", func() bool {
		var code int
		code, out, _ = h.run("", nil, "bcgw", "health", "--data-dir", h.gws[hold].dataDir)
		return code == 1
	})
	if !strings.Contains(out, "postgresql UNREACHABLE since") || !strings.Contains(out, "ping postgres host="+proxies[hold].Dir()) {
		t.Errorf("bcgw health on the cut gateway:\n%s", out)
	}
	down := fmt.Sprintf("gateways/gw%d is DOWN", hold+1)
	waitUntil("HAProxy marked it down", func() bool { return strings.Contains(h.haproxy.stderr.String(), down) })
	waitUntil("the node is on the other gateway", func() bool { return h.holder(id, 1, func(i int) bool { return i == other }) == other })

	ctx := context.Background()
	admin := adminapi.NewClient(h.gws[other].dataDir, "", "")
	c, err := admin.Send(ctx, adminapi.CommandRequest{Node: id, Kind: "agent.ping"})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := admin.Command(ctx, c.ID, 30*time.Second); err != nil || v.Status != "SUCCEEDED" {
		t.Fatalf("a command through the gateway with its database: %+v %v", v, err)
	}

	proxies[hold].Open(t)
	h.gws[hold].waitLog(t, "database reachable again", 30*time.Second)
	up := fmt.Sprintf("gateways/gw%d is UP", hold+1)
	waitUntil("HAProxy marked it up again", func() bool { return strings.Contains(h.haproxy.stderr.String(), up) })
	if code, out, errOut := h.run("", nil, "bcgw", "health", "--data-dir", h.gws[hold].dataDir); code != 0 || !strings.Contains(out, "postgresql answers") {
		t.Errorf("bcgw health with the database back: exit %d\n%s%s", code, out, errOut)
	}
	node.signal(syscall.SIGTERM)
	node.wait(t, 15*time.Second)
}
