package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// A running command's latest CommandProgress shows in its admin view until
// its result arrives; progress for another node's command, or that is not
// JSON, is dropped.
func TestCommandProgress(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a, other := g.join(t), g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _, err := openSession(t, ctx, g.client(t, certOf(a)), a.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the session", func() bool { return g.s.Connected(a.NodeID) })
	c, err := g.s.SendCommand(a.NodeID, "deploy.image", []byte(`{}`), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := g.s.SendCommand(other.NodeID, "deploy.image", []byte(`{}`), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	send := func(id, detail string) {
		t.Helper()
		if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Progress{Progress: &bcdv1.CommandProgress{CommandId: id, Detail: []byte(detail)}}}); err != nil {
			t.Fatal(err)
		}
	}
	ac := gateway.NewAdminClient(g.dir, "", "")
	view := func(id string) gateway.CommandView {
		t.Helper()
		v, err := ac.Command(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	send(c.ID, `{"written":1}`)
	send(c.ID, `{"written":2}`)
	send(theirs.ID, `{"written":3}`)
	send(c.ID, `not json`)
	waitFor(t, "the progress", func() bool { return string(view(c.ID).Progress) == `{"written":2}` })
	if v := view(theirs.ID); v.Progress != nil {
		t.Fatalf("another node's progress was kept: %s", v.Progress)
	}
	if v := view(c.ID); v.ProgressAt == nil || string(v.Progress) != `{"written":2}` {
		t.Fatalf("view %+v", v)
	}
	// The result replaces it.
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: c.ID, Status: "SUCCEEDED"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the result", func() bool { return view(c.ID).State == "done" })
	send(c.ID, `{"written":9}`)
	time.Sleep(50 * time.Millisecond)
	if v := view(c.ID); v.Progress != nil {
		t.Fatalf("a finished command shows progress: %s", v.Progress)
	}
}
