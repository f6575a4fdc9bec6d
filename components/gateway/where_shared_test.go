package gateway_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/gateway"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Every gateway on one database says where a node is connected: its node
// list and status name the gateway holding the session, a tunnel asked of
// another gateway is refused with that name, a session that ends clears
// it, and an old session ending after its node moved to another gateway
// leaves the new one's name.
func TestWhereANodeIsConnected(t *testing.T) {
	g1, g2 := twoGateways(t, gateway.Config{})
	if g1.s.Name() == g2.s.Name() {
		t.Fatalf("two gateways named %q", g1.s.Name())
	}
	a := g1.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a1, a2 := gateway.NewAdminClient(g1.dir, "", ""), gateway.NewAdminClient(g2.dir, "", "")
	view := func(c *gateway.AdminClient) gateway.NodeView {
		t.Helper()
		ns, err := c.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if n.ID == a.NodeID {
				return n
			}
		}
		t.Fatalf("node %s not listed", a.NodeID)
		return gateway.NodeView{}
	}
	on := func(c *gateway.AdminClient, gwName string) func() bool {
		return func() bool {
			n := view(c)
			return n.Connected == (gwName != "") && n.Gateway == gwName
		}
	}

	sctx, scancel := context.WithCancel(ctx)
	st := g2.agentSession(t, sctx, a, &bcdv1.Hello{})
	for i, c := range []*gateway.AdminClient{a1, a2} {
		if n := view(c); !n.Connected || n.Gateway != g2.s.Name() {
			t.Errorf("gateway %d lists %+v, want connected to %s", i+1, n, g2.s.Name())
		}
	}
	if v, err := a1.Status(ctx, a.NodeID); err != nil || !v.Connected || v.Gateway != g2.s.Name() {
		t.Errorf("status on the first gateway: %+v %v", v, err)
	}
	_, _, err := a1.Tunnel(ctx, a.NodeID, gateway.TunnelRequest{Kind: "ssh"})
	if err == nil || !strings.Contains(err.Error(), "is on gateway "+g2.s.Name()) {
		t.Errorf("a tunnel through the first gateway: %v, want one naming %s", err, g2.s.Name())
	}

	// The session ends: neither gateway lists it connected.
	scancel()
	_ = st.CloseRequest()
	_ = st.CloseResponse()
	waitFor(t, "the first gateway to list it disconnected", on(a1, ""))
	waitFor(t, "the second gateway to list it disconnected", on(a2, ""))

	// The node's session on the second gateway, then a newer one on the
	// first: the old one ending on the second leaves the first's name.
	g2.agentSession(t, ctx, a, &bcdv1.Hello{})
	waitFor(t, "connected to the second", on(a1, g2.s.Name()))
	g1.agentSession(t, ctx, a, &bcdv1.Hello{})
	waitFor(t, "the old session to end", func() bool { return !g2.s.Connected(a.NodeID) })
	waitFor(t, "the second gateway to list it on the first", on(a2, g1.s.Name()))
	if n := view(a1); !n.Connected || n.Gateway != g1.s.Name() {
		t.Errorf("the first gateway lists %+v, want connected to itself", n)
	}
}
