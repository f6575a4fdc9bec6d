package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// A running command's progress reaches the command's view on every
// gateway, not only the one holding the node's session: a notice passes
// it on (at most one a second per command), and the result notice clears
// it everywhere.
func TestProgressAcrossGateways(t *testing.T) {
	g1, g2 := twoGateways(t, gateway.Config{})
	a := g1.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _, err := openSession(t, ctx, g2.client(t, certOf(a)), a.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the session on the second gateway", func() bool { return g2.s.Connected(a.NodeID) })
	ac := adminapi.NewClient(g1.dir, "", "")
	c, err := ac.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "deploy.image", Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	view := func() adminapi.CommandView {
		t.Helper()
		v, err := ac.Command(ctx, c.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	send := func(detail string) {
		t.Helper()
		if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Progress{Progress: &bcdv1.CommandProgress{CommandId: c.ID, Detail: []byte(detail)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 3; i++ {
		send(fmt.Sprintf(`{"written":%d}`, i))
		want := fmt.Sprintf(`{"written":%d}`, i)
		waitFor(t, "progress "+want+" on the first gateway", func() bool { return string(view().Progress) == want })
		time.Sleep(time.Second) // the next one is due a notice
	}
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: c.ID, Status: "SUCCEEDED"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the result on the first gateway", func() bool { return view().State == "done" })
	if v := view(); v.Progress != nil {
		t.Errorf("a finished command shows progress: %s", v.Progress)
	}
}
