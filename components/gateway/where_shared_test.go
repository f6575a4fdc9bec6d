package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
	"github.com/better-compute/bcd/components/trust/pki"
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
	a1, a2 := adminapi.NewClient(g1.dir, "", ""), adminapi.NewClient(g2.dir, "", "")
	view := func(c *adminapi.Client) adminapi.NodeView {
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
		return adminapi.NodeView{}
	}
	on := func(c *adminapi.Client, gwName string) func() bool {
		return func() bool {
			n := view(c)
			return n.Connected == (gwName != "") && n.Gateway == gwName
		}
	}

	sctx, scancel := context.WithCancel(ctx)
	st := g2.agentSession(t, sctx, a, &bcdv1.Hello{})
	for i, c := range []*adminapi.Client{a1, a2} {
		if n := view(c); !n.Connected || n.Gateway != g2.s.Name() {
			t.Errorf("gateway %d lists %+v, want connected to %s", i+1, n, g2.s.Name())
		}
	}
	if v, err := a1.Status(ctx, a.NodeID); err != nil || !v.Connected || v.Gateway != g2.s.Name() {
		t.Errorf("status on the first gateway: %+v %v", v, err)
	}
	_, _, err := a1.Tunnel(ctx, a.NodeID, adminapi.TunnelRequest{Kind: "ssh"})
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

// Notices lost while a gateway's listener was away (its database cut)
// are made up for when it listens again: a trust root added and a node
// revoked through the other gateway meanwhile reach it, the bundle and
// the revocation of a session it holds.
func TestLostNoticesMadeUp(t *testing.T) {
	c := pgtest.StartT(t)
	url, err := c.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	proxy, viaProxy := pgtest.NewProxy(t, url)
	kekFile, _ := writeKEK(t)
	g1 := startGateway(t, gateway.Config{Database: url, KEKFile: kekFile})
	g2 := startGateway(t, gateway.Config{Database: viaProxy, KEKFile: kekFile})
	for _, g := range []*gw{g1, g2} {
		waitFor(t, "the notice listener", func() bool { return strings.Contains(g.logs.String(), "listening for the other gateways' notices") })
	}
	a := g1.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := g2.agentSession(t, ctx, a, &bcdv1.Hello{})
	// An event acked: the session is past its Welcome's store reads, in
	// its loop, where a lost database does not end it.
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Event{Event: &bcdv1.Event{Seq: 1, Type: "boot", AtUnixMs: time.Now().UnixMilli()}}})
	if f := recv(t, st); f.GetAck().GetEventSeq() != 1 {
		t.Fatalf("after an event: %v, want its ack", f)
	}

	proxy.Cut()
	waitFor(t, "the second gateway to lose its listener", func() bool {
		return strings.Contains(g2.logs.String(), "notices from the other gateways lost")
	})
	k, _ := pki.GenerateKey()
	if _, err := g1.s.AddTrustRoot(spkiOf(t, k)); err != nil {
		t.Fatal(err)
	}
	if err := g1.s.Revoke(a.NodeID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the notices are gone by now
	proxy.Open(t)

	revoked := make(chan bool, 1)
	var endErr error
	go func() {
		for {
			f, err := st.Receive()
			if err != nil {
				endErr = err
				revoked <- false
				return
			}
			if f.GetRevocation() != nil {
				revoked <- true
				return
			}
		}
	}()
	select {
	case ok := <-revoked:
		if !ok {
			t.Errorf("the session ended without its revocation: %v\nthe second gateway's log:\n%s", endErr, g2.logs.String())
		}
	case <-time.After(40 * time.Second):
		t.Error("no revocation within 40s of the database coming back")
	}
	end := time.Now().Add(40 * time.Second)
	for g2.s.TrustBundle().GetVersion() != 2 {
		if time.Now().After(end) {
			t.Fatalf("the second gateway holds trust version %d, want 2", g2.s.TrustBundle().GetVersion())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
