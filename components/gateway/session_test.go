package gateway_test

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/better-compute/bcd/components/base/backoff"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

func TestSessionBusyCarriesPushback(t *testing.T) {
	const pushback = 1234 * time.Millisecond
	g := startGateway(t, gateway.Config{MaxSessions: 1, Pushback: pushback})
	a, b := g.join(t), g.join(t)

	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	stA, f, err := openSession(t, ctxA, g.client(t, certOf(a)), a.NodeID)
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("first session: %v, first frame %v", err, f)
	}
	clB := g.client(t, certOf(b))
	_, _, err = openSession(t, context.Background(), clB, b.NodeID)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("second session: %v, want ResourceExhausted", err)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("%T is not a connect error", err)
	}
	if got := ce.Meta().Get("grpc-retry-pushback-ms"); got != "1234" {
		t.Errorf("grpc-retry-pushback-ms = %q, want 1234", got)
	}
	if d, ok := backoff.Pushback(err); !ok || d != pushback {
		t.Errorf("join.Pushback = %v %v, want %v", d, ok, pushback)
	}

	// Once the first session ends, the second node gets in.
	cancelA()
	_ = stA.CloseRequest()
	_ = stA.CloseResponse()
	waitFor(t, "the first session to end", func() bool { return !g.s.Connected(a.NodeID) })
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	if _, f, err := openSession(t, ctxB, clB, b.NodeID); err != nil || f.GetWelcome() == nil {
		t.Fatalf("second node after the first left: %v, %v", err, f)
	}
}

func TestSessionLimitHoldsForConcurrentDials(t *testing.T) {
	g := startGateway(t, gateway.Config{MaxSessions: 1, Pushback: 50 * time.Millisecond})
	a, b := g.join(t), g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []*connect.BidiStreamForClient[bcdv1.AgentFrame, bcdv1.GatewayFrame]
	for _, n := range []*identity.Agent{a, b} {
		st := g.client(t, certOf(n)).Session(ctx)
		t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
		// Headers only: the handler runs its checks and waits for Hello.
		if err := st.Send(nil); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	// Nothing the gateway exposes says a handler is waiting for Hello;
	// give both a moment to get there.
	time.Sleep(100 * time.Millisecond)
	welcomed := 0
	for i, n := range []*identity.Agent{a, b} {
		_ = streams[i].Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Hello{Hello: &bcdv1.Hello{NodeId: n.NodeID}}})
		f, err := streams[i].Receive()
		if err == nil && f.GetWelcome() != nil {
			welcomed++
		}
	}
	if welcomed > 1 || (g.s.Connected(a.NodeID) && g.s.Connected(b.NodeID)) {
		t.Fatalf("%d sessions welcomed with MaxSessions=1", welcomed)
	}
}

func TestSessionAuthentication(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	tests := []struct {
		name  string
		cert  *tls.Certificate
		hello string
		code  connect.Code
	}{
		{"no client certificate", nil, a.NodeID, connect.CodeUnauthenticated},
		{"Hello names another node", certOf(a), "node_someoneelse", connect.CodePermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, f, err := openSession(t, context.Background(), g.client(t, tt.cert), tt.hello)
			if connect.CodeOf(err) != tt.code {
				t.Fatalf("err = %v (first frame %v), want %v", err, f, tt.code)
			}
		})
	}
	if g.s.Connected(a.NodeID) {
		t.Error("a refused session is registered as connected")
	}
}

func TestSessionCommandRoundTrip(t *testing.T) {
	g := startGateway(t, gateway.Config{Heartbeat: 7 * time.Second})
	a := g.join(t)
	// One command waits from before the session: it is sent after Welcome.
	early, err := g.s.SendCommand(a.NodeID, "k.early", []byte(`{"n":1}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, f, err := openSession(t, ctx, g.client(t, certOf(a)), a.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	w := f.GetWelcome()
	if w == nil || w.GetEpoch() != 1 || w.GetHeartbeatSeconds() != 7 {
		t.Fatalf("first frame %v, want Welcome epoch 1 heartbeat 7", f)
	}
	if d := time.Since(time.UnixMilli(w.GetServerTimeUnixMs())); d < -time.Minute || d > time.Minute {
		t.Errorf("Welcome server time is %v off", d)
	}
	f, err = st.Receive()
	if err != nil || f.GetCommand().GetId() != early.ID {
		t.Fatalf("after Welcome: %v %v, want the pending command %s", f, err, early.ID)
	}
	if c := f.GetCommand(); c.GetNodeId() != a.NodeID || c.GetKind() != "k.early" || string(c.GetBody()) != `{"n":1}` ||
		c.GetDeadlineUnixMs() < time.Now().Add(9*time.Minute).UnixMilli() {
		t.Errorf("command frame %v", c)
	}
	waitFor(t, "the session to register", func() bool { return g.s.Connected(a.NodeID) })
	live, err := g.s.SendCommand(a.NodeID, "k.live", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if f, err = st.Receive(); err != nil || f.GetCommand().GetId() != live.ID {
		t.Fatalf("live command: %v %v", f, err)
	}
	// Ack receipt of both, then a result for the first (twice: once stored).
	send := func(f *bcdv1.AgentFrame) {
		t.Helper()
		if err := st.Send(f); err != nil {
			t.Fatal(err)
		}
	}
	send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Ack{Ack: &bcdv1.Ack{CommandIds: []string{early.ID, live.ID}}}})
	for _, out := range []string{`{"ok":true}`, `{"ok":"again"}`} {
		send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: early.ID, Status: "SUCCEEDED", Output: []byte(out)}}})
		f, err = st.Receive()
		if err != nil || len(f.GetAck().GetResultIds()) != 1 || f.GetAck().GetResultIds()[0] != early.ID {
			t.Fatalf("after a result: %v %v, want an Ack for %s", f, err, early.ID)
		}
	}
	c, err := g.s.Store().Command(early.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != store.StateDone || c.Result == nil || string(c.Result.Output) != `{"ok":true}` {
		t.Errorf("stored command %+v result %+v, want done with the first output", c, c.Result)
	}
	waitFor(t, "the ack of the live command", func() bool {
		c, err := g.s.Store().Command(live.ID)
		return err == nil && c.State == store.StateDelivered
	})
	un, err := g.s.Store().Unfinished(a.NodeID)
	if err != nil || len(un) != 1 || un[0].ID != live.ID {
		t.Errorf("unfinished %v %v, want only %s", un, err, live.ID)
	}
	// A result for a command the gateway does not know is acked, so the
	// agent stops re-sending it, and stored nowhere.
	send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: "cmd_unknown", Status: "SUCCEEDED"}}})
	if f, err = st.Receive(); err != nil || !slices.Equal(f.GetAck().GetResultIds(), []string{"cmd_unknown"}) {
		t.Fatalf("after a result for an unknown command: %v %v, want its ack", f, err)
	}
	if _, err := g.s.Store().Command("cmd_unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown command's result stored: %v", err)
	}
	// A second Hello on the same stream ends it.
	send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Hello{Hello: &bcdv1.Hello{NodeId: a.NodeID}}})
	if _, err := st.Receive(); err == nil {
		t.Error("the stream went on after a second Hello")
	}
}

func TestSessionRevocation(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	cl := g.client(t, certOf(a))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, f, err := openSession(t, ctx, cl, a.NodeID)
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("session: %v %v", err, f)
	}
	if err := g.s.Revoke(a.NodeID); err != nil {
		t.Fatal(err)
	}
	// The live session is told, then ended.
	f, err = st.Receive()
	if err != nil || f.GetRevocation() == nil {
		t.Fatalf("live session after Revoke: %v %v, want RevocationNotice", f, err)
	}
	if f, err := st.Receive(); err == nil {
		t.Fatalf("live session went on after RevocationNotice: %v", f)
	}
	// A new session is told at once.
	_, f, err = openSession(t, context.Background(), cl, a.NodeID)
	if err != nil || f.GetRevocation() == nil {
		t.Fatalf("revoked node's new session: first frame %v, err %v, want RevocationNotice", f, err)
	}
	if g.s.Connected(a.NodeID) {
		t.Error("revoked node is connected")
	}
	if _, err := g.s.SendCommand(a.NodeID, "k", nil, 0); err == nil {
		t.Error("a command was stored for a revoked node")
	}
	if un, _ := g.s.Store().Unfinished(a.NodeID); len(un) != 0 {
		t.Errorf("revoked node has commands %v", un)
	}
	if err := g.s.Revoke("node_unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Revoke of an unknown node: %v, want ErrNotFound", err)
	}
	// Renew is refused too.
	k, _ := pki.GenerateKey()
	csr, _ := pki.CreateCSR(k, "x")
	proof, _ := pki.Sign(a.Key, pki.PurposeRenew, csr)
	_, err = cl.Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: csr, Proof: proof}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("Renew of a revoked node: %v, want PermissionDenied", err)
	}
}

func TestShutdownDrainsSessions(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, f, err := openSession(t, ctx, g.client(t, certOf(a)), a.NodeID)
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("session: %v %v", err, f)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- g.stop(false) }()
	f, err = st.Receive()
	if err != nil || f.GetDrain() == nil {
		t.Fatalf("frame at shutdown %v, %v, want Drain", f, err)
	}
	if f.GetDrain().GetRedialAfterMs() == 0 {
		t.Error("Drain asks for no redial delay")
	}
	_ = st.CloseRequest()
	_ = st.CloseResponse()
	g.closeIdle()
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
