package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
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
	ac := adminapi.NewClient(g.dir, "", "")
	view := func(id string) adminapi.CommandView {
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
	// A result for an unknown command is acked: once that Ack is back,
	// the gateway has handled every frame before it (one stream, in order).
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: "cmd_sentinel", Status: "SUCCEEDED"}}}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := st.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if ids := f.GetAck().GetResultIds(); len(ids) == 1 && ids[0] == "cmd_sentinel" {
			break
		}
	}
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

// What the gateway keeps for a command (its user data) ends with it: on
// its result, and on a cancel before delivery, which also wakes an admin
// call waiting for it.
func TestCommandStateEndsWithTheCommand(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a, idle := g.join(t), g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	secret := func(id string) string {
		v, _ := g.s.Store().Meta("cmd/" + id + "/secret/" + fleet.SecretUserData)
		return string(v)
	}
	// Ended by its result.
	st, _, err := openSession(t, ctx, g.client(t, certOf(a)), a.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the session", func() bool { return g.s.Connected(a.NodeID) })
	c, err := g.s.SendCommandWithSecrets(a.NodeID, "deploy.image", []byte(`{}`), time.Minute, map[string][]byte{fleet.SecretUserData: []byte("#cloud-config")})
	if err != nil {
		t.Fatal(err)
	}
	if secret(c.ID) != "#cloud-config" {
		t.Fatal("the user data was not stored with the command")
	}
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: c.ID, Status: "SUCCEEDED"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the user data dropped with the result", func() bool { return secret(c.ID) == "" })

	// Cancelled before delivery (its node is not connected).
	c2, err := g.s.SendCommandWithSecrets(idle.NodeID, "deploy.image", []byte(`{}`), time.Minute, map[string][]byte{fleet.SecretUserData: []byte("#cloud-config")})
	if err != nil {
		t.Fatal(err)
	}
	ac := adminapi.NewClient(g.dir, "", "")
	woke := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		ac.Command(ctx, c2.ID, 20*time.Second)
		woke <- time.Since(start)
	}()
	time.Sleep(300 * time.Millisecond) // the call is waiting
	if _, err := g.s.CancelCommand(c2.ID, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-woke:
		t.Logf("the waiting admin call returned %v after it started", d)
	case <-time.After(10 * time.Second):
		t.Fatal("a cancel before delivery did not wake the admin call waiting for the command")
	}
	if secret(c2.ID) != "" {
		t.Fatal("the user data outlived the cancelled command")
	}
}
