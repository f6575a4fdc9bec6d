package session_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/agent/clock"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/agent/transport"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/wellknown"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

const wait = 5 * time.Second

// ---- a scripted gateway over real TLS ----

// fakeGW serves Session and hands every accepted stream to the test.
type fakeGW struct {
	bcdv1connect.UnimplementedAgentGatewayHandler
	sessions chan *peer
}

// peer is one session as the gateway sees it. Frames to the agent go out
// from the handler's goroutine, so no Send races the handler's return.
type peer struct {
	hello  *bcdv1.Hello
	frames chan *bcdv1.AgentFrame // closed when the agent's side ends
	out    chan sendReq
	end    chan error    // the handler returns what is sent here
	done   chan struct{} // closed when the handler returns
}

type sendReq struct {
	f    *bcdv1.GatewayFrame
	errc chan error
}

func (g *fakeGW) Session(ctx context.Context, st *connect.BidiStream[bcdv1.AgentFrame, bcdv1.GatewayFrame]) error {
	f, err := st.Receive()
	if err != nil {
		return err
	}
	if f.GetHello() == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("first frame must be Hello"))
	}
	p := &peer{
		hello: f.GetHello(), frames: make(chan *bcdv1.AgentFrame, 1024),
		out: make(chan sendReq), end: make(chan error, 1), done: make(chan struct{}),
	}
	defer close(p.done)
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		defer close(p.frames)
		for {
			f, err := st.Receive()
			if err != nil {
				return
			}
			p.frames <- f
		}
	}()
	g.sessions <- p
	for {
		select {
		case r := <-p.out:
			r.errc <- st.Send(r.f)
		case err := <-p.end:
			return err
		case <-recvDone:
			// The agent ended the session.
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// startFake serves a fakeGW on loopback TLS (a serving CA of its own, as
// bcgw has) and returns a client that pins it, as agents dial.
func startFake(t *testing.T) (*fakeGW, bcdv1connect.AgentGatewayClient) {
	t.Helper()
	ca, err := pki.NewCA("fake serving CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.IssueServer(key.Public(), []string{"bcgw.lab"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	g := &fakeGW{sessions: make(chan *peer, 16)}
	mux := http.NewServeMux()
	path, h := bcdv1connect.NewAgentGatewayHandler(g)
	mux.Handle(path, h)
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.TLS = pki.ServerTLS(pki.TLSCertificate(leaf, key, ca.Cert), nil)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cl, hc, err := transport.Client(transport.Options{URL: srv.URL, ServerName: "bcgw.lab", ServingCASPKIPin: pki.PinOfCert(ca.Cert)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	return g, cl
}

func (g *fakeGW) next(t *testing.T) *peer {
	t.Helper()
	select {
	case p := <-g.sessions:
		return p
	case <-time.After(wait):
		t.Fatal("no session dialed")
		return nil
	}
}

// trySend sends f to the agent and reports whether the session was still
// there to take it.
func (p *peer) trySend(f *bcdv1.GatewayFrame) bool {
	r := sendReq{f: f, errc: make(chan error, 1)}
	select {
	case p.out <- r:
		return <-r.errc == nil
	case <-p.done:
		return false
	}
}

func (p *peer) send(t *testing.T, f *bcdv1.GatewayFrame) {
	t.Helper()
	if !p.trySend(f) {
		t.Fatalf("send %v: the session has ended", f)
	}
}

// recv returns the agent's next frame other than a heartbeat.
func (p *peer) recv(t *testing.T) *bcdv1.AgentFrame {
	t.Helper()
	for {
		select {
		case f, ok := <-p.frames:
			if !ok {
				t.Fatal("the agent ended the session")
			}
			if f.GetHeartbeat() != nil {
				continue
			}
			return f
		case <-time.After(wait):
			t.Fatal("no frame from the agent")
		}
	}
}

// ended waits for the agent to end the session and returns what it sent
// before.
func (p *peer) ended(t *testing.T) []*bcdv1.AgentFrame {
	t.Helper()
	var got []*bcdv1.AgentFrame
	timeout := time.After(wait)
	for {
		select {
		case f, ok := <-p.frames:
			if !ok {
				return got
			}
			got = append(got, f)
		case <-timeout:
			t.Fatal("the agent did not end the session")
		}
	}
}

func welcome(epoch uint64, server time.Time) *bcdv1.GatewayFrame {
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Welcome{Welcome: &bcdv1.Welcome{
		Epoch: epoch, ServerTimeUnixMs: server.UnixMilli(), HeartbeatSeconds: 60,
	}}}
}

func command(id, node string, deadline time.Time, body []byte) *bcdv1.GatewayFrame {
	c := &bcdv1.Command{Id: id, NodeId: node, Kind: "k", Body: body}
	if !deadline.IsZero() {
		c.DeadlineUnixMs = deadline.UnixMilli()
	}
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Command{Command: c}}
}

func ackResults(ids ...string) *bcdv1.GatewayFrame {
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Ack{Ack: &bcdv1.Ack{ResultIds: ids}}}
}

// ---- the agent side ----

// runner counts runs per command id; kind "block" waits for release.
type runner struct {
	mu      sync.Mutex
	runs    map[string]int
	started chan string
	release chan struct{}
}

func newRunner() *runner {
	return &runner{runs: map[string]int{}, started: make(chan string, 64), release: make(chan struct{})}
}

func (r *runner) Kinds() []string { return []string{"block", "k"} }

func (r *runner) Run(ctx context.Context, c *bcdv1.Command) *bcdv1.CommandResult {
	r.mu.Lock()
	r.runs[c.GetId()]++
	r.mu.Unlock()
	r.started <- c.GetId()
	if c.GetKind() == "block" {
		select {
		case <-r.release:
		case <-ctx.Done():
		}
	}
	return &bcdv1.CommandResult{Status: "SUCCEEDED", Output: []byte(`"ran ` + c.GetId() + `"`)}
}

func (r *runner) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

// dispatcherFor runs r's kinds through a real dispatcher over a journal in
// a temp dir, with workers in the control lane.
func dispatcherFor(t *testing.T, nodeID string, r *runner, workers int, clk *clock.Clock) *dispatch.Dispatcher {
	t.Helper()
	j, _, err := journal.Open(filepath.Join(t.TempDir(), journal.File), nodeID)
	if err != nil {
		t.Fatal(err)
	}
	runAs := func(kind string) func(context.Context, []byte) (json.RawMessage, error) {
		return func(ctx context.Context, body []byte) (json.RawMessage, error) {
			return r.Run(ctx, &bcdv1.Command{Id: dispatch.CommandID(ctx), Kind: kind, Body: body}).GetOutput(), nil
		}
	}
	cfg := dispatch.Config{NodeID: nodeID, Journal: j, Lanes: map[string]int{dispatch.LaneControl: workers},
		Kinds: []dispatch.Kind{{Name: "k", Run: runAs("k")}, {Name: "block", Run: runAs("block")}}}
	if clk != nil {
		cfg.Clock = clk
	}
	d, err := dispatch.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; j.Close() })
	return d
}

type agent struct {
	epochs chan uint64
	done   chan error
}

// startAgent runs a session until the test ends. cfg's Client, NodeID and
// Runner must be set; the rest gets short back-offs.
func startAgent(t *testing.T, cfg session.Config) *agent {
	t.Helper()
	if cfg.Role == "" {
		cfg.Role = "node"
	}
	cfg.BootID, cfg.Version = "boot-1", "test"
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase, cfg.BackoffMax = time.Millisecond, 5*time.Millisecond
	}
	a := &agent{epochs: make(chan uint64, 16), done: make(chan error, 1)}
	cfg.OnWelcome = func(w *bcdv1.Welcome) { a.epochs <- w.GetEpoch() }
	s := session.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { a.done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-a.done:
		case <-time.After(wait):
			t.Error("Run did not return after its context ended")
		}
	})
	return a
}

func (a *agent) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-a.done:
		a.done <- err // for cleanup
		return err
	case <-time.After(wait):
		t.Fatal("Run did not return")
		return nil
	}
}

func (a *agent) welcomed() []uint64 {
	var out []uint64
	for {
		select {
		case e := <-a.epochs:
			out = append(out, e)
		default:
			return out
		}
	}
}

const me = "node_me"

// ---- tests ----

func TestHelloAndAcceptRules(t *testing.T) {
	t.Parallel()
	g, cl := startFake(t)
	r := newRunner()
	startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, r, 3, nil)})
	p := g.next(t)
	h := p.hello
	if h.GetNodeId() != me || h.GetBootId() != "boot-1" || h.GetRole() != "node" || h.GetVersion() != "test" ||
		!slices.Equal(h.GetKinds(), []string{"block", "k"}) || len(h.GetInFlight()) != 0 {
		t.Errorf("Hello %v", h)
	}
	if l := h.GetLanes(); len(l) != 1 || l[0].GetLane() != "control" || l[0].GetSize() != 3 || l[0].GetFree() != 3 {
		t.Errorf("Hello lanes %v, want one control lane 3/3", l)
	}
	now := time.Now()
	p.send(t, welcome(1, now))

	cmds := []struct {
		id, node string
		deadline time.Time
		body     []byte
		status   string // "" = no result expected (duplicate)
		errText  string
	}{
		{"c_other", "node_other", now.Add(time.Minute), nil, "REFUSED", "command is for another node"},
		{"c_late", me, now.Add(-time.Minute), nil, "REFUSED", "command is past its deadline"},
		{"c_big", me, now.Add(time.Minute), bytes.Repeat([]byte("x"), dispatch.MaxBody+1), "REFUSED", "more than 1 MiB"},
		{"c_ok", me, now.Add(time.Minute), []byte(`{}`), "SUCCEEDED", ""},
		{"c_ok", me, now.Add(time.Minute), []byte(`{}`), "", ""}, // delivered again
		{"c_nodeadline", me, time.Time{}, nil, "SUCCEEDED", ""},
		{"c_maxbody", me, now.Add(time.Minute), bytes.Repeat([]byte("y"), dispatch.MaxBody), "SUCCEEDED", ""},
	}
	for _, c := range cmds {
		p.send(t, command(c.id, c.node, c.deadline, c.body))
	}
	var acked []string
	results := map[string][]*bcdv1.CommandResult{}
	wantResults := 0
	for _, c := range cmds {
		if c.status != "" {
			wantResults++
		}
	}
	for n := 0; len(acked) < len(cmds) || n < wantResults; {
		f := p.recv(t)
		switch {
		case f.GetAck() != nil:
			acked = append(acked, f.GetAck().GetCommandIds()...)
		case f.GetResult() != nil:
			results[f.GetResult().GetCommandId()] = append(results[f.GetResult().GetCommandId()], f.GetResult())
			n++
		default:
			t.Fatalf("unexpected frame %v", f)
		}
	}
	var wantAcked []string
	for _, c := range cmds {
		wantAcked = append(wantAcked, c.id)
	}
	if !slices.Equal(acked, wantAcked) {
		t.Errorf("acked %v, want every delivery acked in order %v", acked, wantAcked)
	}
	for _, c := range cmds {
		if c.status == "" {
			continue
		}
		rs := results[c.id]
		if len(rs) != 1 {
			t.Errorf("%s: %d results, want 1", c.id, len(rs))
			continue
		}
		if rs[0].GetStatus() != c.status || !strings.Contains(rs[0].GetError(), c.errText) {
			t.Errorf("%s: result %s %q, want %s %q", c.id, rs[0].GetStatus(), rs[0].GetError(), c.status, c.errText)
		}
		if rs[0].GetStartedUnixMs() == 0 || rs[0].GetFinishedUnixMs() < rs[0].GetStartedUnixMs() {
			t.Errorf("%s: times %d..%d", c.id, rs[0].GetStartedUnixMs(), rs[0].GetFinishedUnixMs())
		}
	}
	for id, want := range map[string]int{"c_other": 0, "c_late": 0, "c_big": 0, "c_ok": 1, "c_nodeadline": 1, "c_maxbody": 1} {
		if got := r.count(id); got != want {
			t.Errorf("%s ran %d times, want %d", id, got, want)
		}
	}
	// The duplicate produced no second result: a later command's result
	// comes next.
	p.send(t, ackResults("c_other", "c_late", "c_big", "c_ok", "c_nodeadline", "c_maxbody"))
	p.send(t, command("c_marker", me, time.Time{}, nil))
	for {
		f := p.recv(t)
		if f.GetAck() != nil {
			continue
		}
		if f.GetResult().GetCommandId() != "c_marker" {
			t.Fatalf("frame %v before the marker's result", f)
		}
		break
	}
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	g, cl := startFake(t)
	startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, newRunner(), 2, nil)})
	p := g.next(t)
	w := welcome(1, time.Now())
	w.GetWelcome().HeartbeatSeconds = 1
	p.send(t, w)
	select {
	case f := <-p.frames:
		hb := f.GetHeartbeat()
		if hb == nil {
			t.Fatalf("frame %v, want Heartbeat", f)
		}
		if d := time.Since(time.UnixMilli(hb.GetSentUnixMs())); d < -time.Second || d > 5*time.Second {
			t.Errorf("heartbeat sent time %v off", d)
		}
		if l := hb.GetLanes(); len(l) != 1 || l[0].GetSize() != 2 || l[0].GetFree() != 2 {
			t.Errorf("heartbeat lanes %v", l)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no heartbeat within 3s of a 1s interval")
	}
}

func TestWelcomeBehindTimeMarkRefused(t *testing.T) {
	t.Parallel()
	g, cl := startFake(t)
	dir := t.TempDir()
	now := time.Now()
	mark, err := clock.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := mark.Accept(now); err != nil {
		t.Fatal(err)
	}
	// A new process: the mark comes from the data directory.
	clk, err := clock.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := newRunner()
	a := startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, r, 4, clk), Clock: clk})

	p1 := g.next(t)
	p1.send(t, welcome(7, now.Add(-10*time.Minute)))
	p1.trySend(command("c1", me, time.Time{}, nil)) // the agent may have hung up already
	if got := p1.ended(t); len(got) != 0 {
		t.Errorf("the agent sent %v after a refused Welcome", got)
	}
	// It redials; an honest Welcome is taken.
	p2 := g.next(t)
	if r.count("c1") != 0 {
		t.Fatal("a command ran on a session whose Welcome was refused")
	}
	p2.send(t, welcome(8, now.Add(time.Second)))
	p2.send(t, command("c2", me, time.Time{}, nil))
	for f := p2.recv(t); f.GetResult() == nil; f = p2.recv(t) {
	}
	if r.count("c1") != 0 || r.count("c2") != 1 {
		t.Errorf("runs c1=%d c2=%d, want 0 and 1", r.count("c1"), r.count("c2"))
	}
	if got := a.welcomed(); !slices.Equal(got, []uint64{8}) {
		t.Errorf("OnWelcome saw epochs %v, want only 8", got)
	}
	if m := clk.Mark(); m.UnixMilli() != now.Add(time.Second).UnixMilli() {
		t.Errorf("mark %v, want the accepted Welcome's time", m)
	}
}

func TestDrainRedials(t *testing.T) {
	t.Parallel()
	g, cl := startFake(t)
	a := startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, newRunner(), 4, nil)})
	p1 := g.next(t)
	p1.send(t, welcome(1, time.Now()))
	p1.send(t, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Drain{Drain: &bcdv1.Drain{Reason: "test", RedialAfterMs: 0}}})
	p1.ended(t)
	p2 := g.next(t)
	if p2.hello.GetNodeId() != me {
		t.Fatalf("second Hello %v", p2.hello)
	}
	p2.send(t, welcome(2, time.Now()))
	p2.send(t, command("c1", me, time.Time{}, nil))
	for f := p2.recv(t); f.GetResult() == nil; f = p2.recv(t) {
	}
	if got := a.welcomed(); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("OnWelcome epochs %v, want [1 2]", got)
	}
}

func TestRevocationEndsRun(t *testing.T) {
	t.Parallel()
	revoke := &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Revocation{Revocation: &bcdv1.RevocationNotice{Reason: "test"}}}
	tests := []struct {
		name   string
		before []*bcdv1.GatewayFrame
	}{
		{"as the first frame", nil},
		{"mid-session", []*bcdv1.GatewayFrame{welcome(1, time.Now())}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, cl := startFake(t)
			a := startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, newRunner(), 4, nil)})
			p := g.next(t)
			for _, f := range tt.before {
				p.send(t, f)
			}
			p.send(t, revoke)
			if err := a.result(t); !errors.Is(err, session.ErrRevoked) {
				t.Fatalf("Run = %v, want ErrRevoked", err)
			}
			select {
			case p := <-g.sessions:
				t.Fatalf("the agent dialed again after revocation: %v", p.hello)
			default:
			}
		})
	}
}

func TestUnackedResultResent(t *testing.T) {
	t.Parallel()
	g, cl := startFake(t)
	r := newRunner()
	startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, r, 4, nil)})

	p1 := g.next(t)
	p1.send(t, welcome(1, time.Now()))
	p1.send(t, command("c1", me, time.Time{}, nil))
	var first *bcdv1.CommandResult
	for f := p1.recv(t); first == nil; f = p1.recv(t) {
		first = f.GetResult()
		if first != nil {
			break
		}
	}
	// No ack: the gateway goes away.
	p1.end <- connect.NewError(connect.CodeUnavailable, errors.New("restarting"))

	p2 := g.next(t)
	p2.send(t, welcome(2, time.Now()))
	f := p2.recv(t)
	if f.GetResult().GetCommandId() != "c1" || f.GetResult().GetStatus() != first.GetStatus() || !bytes.Equal(f.GetResult().GetOutput(), first.GetOutput()) {
		t.Fatalf("first frame after the next Welcome %v, want c1's result again", f)
	}
	// Acked now: a marker command shows the ack was taken before the end.
	p2.send(t, ackResults("c1"))
	p2.send(t, command("c2", me, time.Time{}, nil))
	for f := p2.recv(t); f.GetResult().GetCommandId() != "c2"; f = p2.recv(t) {
	}
	p2.send(t, ackResults("c2"))
	p2.send(t, command("c3", me, time.Time{}, nil))
	for f := p2.recv(t); f.GetResult().GetCommandId() != "c3"; f = p2.recv(t) {
	}
	p2.end <- connect.NewError(connect.CodeUnavailable, errors.New("restarting"))

	// c3 was not acked; c1 and c2 were.
	p3 := g.next(t)
	p3.send(t, welcome(3, time.Now()))
	if f := p3.recv(t); f.GetResult().GetCommandId() != "c3" {
		t.Fatalf("first frame on the third session %v, want only c3 re-sent", f)
	}
	p3.send(t, command("c4", me, time.Time{}, nil))
	if f := p3.recv(t); len(f.GetAck().GetCommandIds()) != 1 || f.GetAck().GetCommandIds()[0] != "c4" {
		t.Fatalf("frame %v, want the ack of c4 (no other result re-sent)", f)
	}
	if r.count("c1") != 1 {
		t.Errorf("c1 ran %d times", r.count("c1"))
	}
}

func TestHelloReportsInFlight(t *testing.T) {
	t.Parallel()
	g, cl := startFake(t)
	r := newRunner()
	startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, r, 2, nil)})
	p1 := g.next(t)
	p1.send(t, welcome(1, time.Now()))
	p1.send(t, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Command{Command: &bcdv1.Command{Id: "b1", NodeId: me, Kind: "block"}}})
	select {
	case <-r.started:
	case <-time.After(wait):
		t.Fatal("b1 did not start")
	}
	p1.end <- connect.NewError(connect.CodeUnavailable, errors.New("restarting"))
	p2 := g.next(t)
	if got := p2.hello.GetInFlight(); !slices.Equal(got, []string{"b1"}) {
		t.Errorf("Hello in_flight %v, want [b1]", got)
	}
	if l := p2.hello.GetLanes(); len(l) != 1 || l[0].GetSize() != 2 || l[0].GetFree() != 1 {
		t.Errorf("Hello lanes %v, want size 2 free 1", l)
	}
	// The command finishes and its result reaches the new session.
	close(r.release)
	p2.send(t, welcome(2, time.Now()))
	if f := p2.recv(t); f.GetResult().GetCommandId() != "b1" || f.GetResult().GetStatus() != "SUCCEEDED" {
		t.Fatalf("frame %v, want b1's result", f)
	}
}

func TestLaneCreditWithQueuedCommands(t *testing.T) {
	g, cl := startFake(t)
	r := newRunner()
	startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, r, 1, nil)})
	p1 := g.next(t)
	p1.send(t, welcome(1, time.Now()))
	for _, id := range []string{"b1", "b2"} {
		p1.send(t, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Command{Command: &bcdv1.Command{Id: id, NodeId: me, Kind: "block"}}})
	}
	<-r.started
	for n := 0; n < 2; {
		if f := p1.recv(t); f.GetAck() != nil {
			n++
		}
	}
	p1.end <- connect.NewError(connect.CodeUnavailable, errors.New("restarting"))
	p2 := g.next(t)
	in := p2.hello.GetInFlight()
	sort.Strings(in)
	if !slices.Equal(in, []string{"b1", "b2"}) {
		t.Errorf("in_flight %v, want [b1 b2]", in)
	}
	l := p2.hello.GetLanes()
	if len(l) != 1 || l[0].GetSize() != 1 || l[0].GetFree() > l[0].GetSize() {
		t.Fatalf("Hello lanes %v: free exceeds size", l)
	}
	close(r.release)
}

func TestFinishedCommandsLeaveInFlight(t *testing.T) {
	g, cl := startFake(t)
	r := newRunner()
	r.started = make(chan string, 4096)
	startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, r, 8, nil)})
	p := g.next(t)
	p.send(t, welcome(1, time.Now()))
	const n = 3000
	for i := range n {
		p.send(t, command(fmt.Sprint("c", i), me, time.Time{}, nil))
	}
	for got := 0; got < n; {
		if f := p.recv(t); f.GetResult() != nil {
			got++
		}
	}
	p.end <- connect.NewError(connect.CodeUnavailable, errors.New("restarting"))
	p2 := g.next(t)
	if in := p2.hello.GetInFlight(); len(in) != 0 {
		t.Fatalf("every command finished, but the next Hello reports %v in flight (lanes %v)", in, p2.hello.GetLanes())
	}
}

// ---- against the real gateway ----

func TestAgainstGateway(t *testing.T) {
	t.Parallel()
	gw, err := gateway.New(gateway.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- gw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-runDone:
			if err != nil {
				t.Errorf("gateway Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("gateway Run did not return")
		}
	})
	deadline := time.Now().Add(wait)
	for gw.Addr() == nil {
		if time.Now().After(deadline) {
			t.Fatal("gateway did not listen")
		}
		time.Sleep(time.Millisecond)
	}
	doc, err := gw.WellKnown()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(doc)
	_, jwk, err := wellknown.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + gw.Addr().String()
	joinClient, hc, err := transport.Client(transport.Options{URL: url, ServerName: "bcgw.lab", ServingCASPKIPin: doc.Pins.ServingCA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	tok, _, err := gw.NewToken("node", "lab", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	id, err := join.Join(context.Background(), join.Options{
		Client: joinClient, Role: "node", Token: tok, EncryptionJWK: jwk, SigningPin: doc.Pins.JoinSigning,
		Claims: &bcdv1.HardwareClaims{Hostname: "h"}, DataDir: t.TempDir(), MaxAttempts: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	cert := id.TLSCertificate()
	cl, hc2, err := transport.Client(transport.Options{URL: url, ServerName: "bcgw.lab", ServingCASPKIPin: doc.Pins.ServingCA,
		ClientCert: func() (*tls.Certificate, error) { return &cert, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc2.CloseIdleConnections)
	r := newRunner()
	a := startAgent(t, session.Config{Client: cl, NodeID: id.NodeID, Dispatcher: dispatcherFor(t, id.NodeID, r, 4, nil)})
	select {
	case e := <-a.epochs:
		if e != 1 {
			t.Errorf("first epoch %d, want 1", e)
		}
	case <-time.After(wait):
		t.Fatal("no Welcome from the gateway")
	}
	c, err := gw.SendCommand(id.NodeID, "k", []byte(`{}`), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(wait)
	for {
		got, err := gw.Store().Command(c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == store.StateDone {
			if got.Result.Status != "SUCCEEDED" || string(got.Result.Output) != `"ran `+c.ID+`"` {
				t.Fatalf("result %+v", got.Result)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("command still %s", got.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if un, _ := gw.Store().Unfinished(id.NodeID); len(un) != 0 {
		t.Errorf("unfinished after the result: %v", un)
	}
	if err := gw.Revoke(id.NodeID); err != nil {
		t.Fatal(err)
	}
	if err := a.result(t); !errors.Is(err, session.ErrRevoked) {
		t.Fatalf("Run after Revoke = %v, want ErrRevoked", err)
	}
}

// TestHelloListsDrivers: every Hello carries the hosted drivers as they
// are at dial time.
func TestHelloListsDrivers(t *testing.T) {
	t.Parallel()
	g, cl := startFake(t)
	r := newRunner()
	var mu sync.Mutex
	drivers := []*bcdv1.Driver{{Id: "ipmi", Kind: "bmc", Version: "1"}}
	startAgent(t, session.Config{Client: cl, NodeID: me, Dispatcher: dispatcherFor(t, me, r, 1, nil),
		Drivers:      func() []*bcdv1.Driver { mu.Lock(); defer mu.Unlock(); return drivers },
		Capabilities: func() []string { return []string{"vm.libvirt-kvm", "vm.accel.tcg"} }})
	p1 := g.next(t)
	if d := p1.hello.GetDrivers(); len(d) != 1 || d[0].GetId() != "ipmi" || d[0].GetKind() != "bmc" {
		t.Fatalf("Hello drivers %v", d)
	}
	if c := p1.hello.GetCapabilities(); strings.Join(c, " ") != "vm.libvirt-kvm vm.accel.tcg" {
		t.Fatalf("Hello capabilities %v", c)
	}
	mu.Lock()
	drivers = append(drivers, &bcdv1.Driver{Id: "kata", Kind: "runtime"})
	mu.Unlock()
	p1.end <- connect.NewError(connect.CodeUnavailable, errors.New("restarting"))
	if d := g.next(t).hello.GetDrivers(); len(d) != 2 {
		t.Fatalf("the next Hello's drivers %v, want 2", d)
	}
}
