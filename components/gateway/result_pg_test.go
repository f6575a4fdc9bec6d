package gateway_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// TestResultStoredAcrossDatabaseRestart: a command result that reaches
// the gateway while PostgreSQL is down is neither lost nor left for the
// node's next session (its agent sends each unacked result once per
// session): the gateway stores it within seconds of the database's
// return, and only then acks it, on the same session.
func TestResultStoredAcrossDatabaseRestart(t *testing.T) {
	c := pgtest.StartT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, err := c.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kekFile, _ := writeKEK(t)
	g := startGateway(t, gateway.Config{Database: url, KEKFile: kekFile})
	a := g.join(t)
	st := g.agentSession(t, ctx, a, &bcdv1.Hello{})
	waitFor(t, "the session to register", func() bool { return g.s.Connected(a.NodeID) })
	cmd, err := g.s.SendCommand(a.NodeID, "agent.ping", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	frames := make(chan *bcdv1.GatewayFrame, 16)
	ended := make(chan error, 1)
	go func() {
		for {
			f, err := st.Receive()
			if err != nil {
				ended <- err
				return
			}
			frames <- f
		}
	}()
	// next returns the first frame f with want(f) before the deadline.
	next := func(what string, within time.Duration, want func(*bcdv1.GatewayFrame) bool) {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case f := <-frames:
				if want(f) {
					return
				}
			case err := <-ended:
				t.Fatalf("the session ended before %s: %v\nthe gateway's log:\n%s", what, err, g.logs.String())
			case <-deadline:
				c, err := g.s.Store().Command(cmd.ID)
				t.Fatalf("no %s within %s (the command is %q, %v)\nthe gateway's log:\n%s", what, within, c.State, err, g.logs.String())
			}
		}
	}
	next("command", 10*time.Second, func(f *bcdv1.GatewayFrame) bool { return f.GetCommand().GetId() == cmd.ID })
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Ack{Ack: &bcdv1.Ack{CommandIds: []string{cmd.ID}}}})
	waitFor(t, "the command delivered", func() bool {
		c, err := g.s.Store().Command(cmd.ID)
		return err == nil && c.State == store.StateDelivered
	})

	c.Pause()
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{
		CommandId: cmd.ID, Status: "SUCCEEDED", Output: []byte(`{"pong":true}`),
	}}})
	time.Sleep(3 * time.Second) // the database stays down a few seconds with the result waiting
	if err := c.Resume(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	next("ack of the result", 10*time.Second, func(f *bcdv1.GatewayFrame) bool { return slices.Contains(f.GetAck().GetResultIds(), cmd.ID) })
	t.Logf("the result was acked %s after the database came back", time.Since(back).Round(time.Millisecond))
	got, err := g.s.Store().Command(cmd.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.StateDone || got.Result == nil || string(got.Result.Output) != `{"pong":true}` {
		t.Errorf("stored command %q with result %+v, want done with the agent's output", got.State, got.Result)
	}
}
