package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
)

// A provisioned token admits one join, with the provisioned attestor only,
// as the node it names; the agent refuses a response for another node;
// joining again (a redeploy) replaces the record of that node.
func TestProvisionedJoin(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	ctx := context.Background()
	mint := func(id string) string {
		t.Helper()
		tok, _, err := g.s.NewProvisionedToken("lab", id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	for _, bad := range []string{"", "Node1", "-x", "a/b", strings.Repeat("a", 64)} {
		if _, _, err := g.s.NewProvisionedToken("lab", bad, time.Hour); err == nil {
			t.Errorf("node id %q accepted", bad)
		}
	}

	// A provisioned token with the join-token attestor is refused, and so
	// is an ordinary token with the provisioned attestor.
	web01 := mint("web-01")
	o := joinOpts(g, g.client(t, nil), web01, t.TempDir())
	if _, err := join.Join(ctx, o); err == nil || !strings.Contains(err.Error(), "provisioned attestor") {
		t.Fatalf("provisioned token, join-token attestor: %v", err)
	}
	// That refusal did not spend the token.
	o.Attestor, o.NodeID = "provisioned", "web-01"
	if _, err := join.Join(ctx, o); err != nil {
		t.Fatalf("the provisioned token after a refused attempt: %v", err)
	}
	o = joinOpts(g, g.client(t, nil), g.token(t, "node", 1), t.TempDir())
	o.Attestor = "provisioned"
	if _, err := join.Join(ctx, o); err == nil || !strings.Contains(err.Error(), "token minted for deploy.image") {
		t.Fatalf("ordinary token, provisioned attestor: %v", err)
	}

	// The agent refuses a response for another node than --node-id, and
	// stores nothing.
	dir := t.TempDir()
	o = joinOpts(g, g.client(t, nil), mint("web-02"), dir)
	o.Attestor, o.NodeID = "provisioned", "web-03"
	if _, err := join.Join(ctx, o); err == nil || !strings.Contains(err.Error(), "not --node-id web-03") {
		t.Fatalf("another node's response: %v", err)
	}
	if _, err := identity.Load(dir); err != identity.ErrNotJoined {
		t.Fatalf("identity after a refused response: %v", err)
	}

	// The real thing, twice: the second join replaces the first record.
	// The node keeps its desired spec; the events of the OS it replaced
	// go (the new agent counts from 1 again).
	var serials []string
	for i := range 2 {
		if i == 1 {
			if _, err := g.s.SetSpec("web-04", []byte(`{"host":{}}`)); err != nil {
				t.Fatal(err)
			}
			if _, err := g.s.Store().AddEvent("web-04", store.Event{Seq: 1, Type: "old"}, fleet.MaxEvents); err != nil {
				t.Fatal(err)
			}
		}
		o = joinOpts(g, g.client(t, nil), mint("web-04"), t.TempDir())
		o.Attestor, o.NodeID = "provisioned", "web-04"
		a, err := join.Join(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if a.NodeID != "web-04" || a.Role != "node" || !strings.HasSuffix(a.Cert.URIs[0].String(), "/node/web-04") {
			t.Fatalf("joined as %s role %s (%s)", a.NodeID, a.Role, a.Cert.URIs[0])
		}
		n, err := g.s.Store().Node("web-04")
		if err != nil {
			t.Fatal(err)
		}
		serials = append(serials, n.CertSerial)
	}
	if serials[0] == serials[1] {
		t.Error("the second provisioned join did not replace the node's certificate")
	}
	if evs, err := g.s.Events("web-04", 0); err != nil || len(evs) != 0 {
		t.Errorf("events of the replaced OS: %+v %v", evs, err)
	}
	if gen, _, err := g.s.Spec("web-04"); err != nil || gen != 1 {
		t.Errorf("spec after the replacing join: %d %v, want generation 1 kept", gen, err)
	}
	// The token was spent.
	tok := mint("web-05")
	o = joinOpts(g, g.client(t, nil), tok, t.TempDir())
	o.Attestor, o.NodeID = "provisioned", "web-05"
	if _, err := join.Join(ctx, o); err != nil {
		t.Fatal(err)
	}
	if _, err := join.Join(ctx, o); err == nil {
		t.Error("a provisioned token admitted a second join")
	}
}
