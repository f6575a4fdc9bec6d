package session_test

import (
	"context"
	"crypto"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/seal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// memLog is an in-memory EventLog.
type memLog struct {
	mu     sync.Mutex
	evs    []*bcdv1.Event
	acked  uint64
	notify chan struct{}
}

func (l *memLog) append(seq uint64) {
	l.mu.Lock()
	l.evs = append(l.evs, &bcdv1.Event{Seq: seq, Type: "t"})
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

func (l *memLog) Unacked() ([]*bcdv1.Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*bcdv1.Event
	for _, e := range l.evs {
		if e.GetSeq() > l.acked {
			out = append(out, e)
		}
	}
	return out, nil
}

func (l *memLog) LastAcked() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acked
}

func (l *memLog) Ack(seq uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acked = max(l.acked, seq)
	return nil
}

func (l *memLog) Notify() <-chan struct{} { return l.notify }

// nextEvent returns the seq of the agent's next Event frame, skipping
// the others.
func nextEvent(t *testing.T, p *peer) uint64 {
	t.Helper()
	for {
		f := p.recv(t)
		if e := f.GetEvent(); e != nil {
			return e.GetSeq()
		}
	}
}

// TestEventsSentUntilAcked: after Welcome the events past its event_ack
// go out in order, new ones as they are appended, and those not acked go
// out again in the next session; Hello names the last acked.
func TestEventsSentUntilAcked(t *testing.T) {
	g, client := startFake(t)
	log := &memLog{notify: make(chan struct{}, 1)}
	for seq := uint64(1); seq <= 3; seq++ {
		log.append(seq)
	}
	startAgent(t, session.Config{Client: client, NodeID: "n1", Dispatcher: dispatcherFor(t, "n1", newRunner(), 1, nil), Events: log})
	p := g.next(t)
	w := welcome(1, time.Now())
	w.GetWelcome().EventAck = 1
	p.send(t, w)
	if a, b := nextEvent(t, p), nextEvent(t, p); a != 2 || b != 3 {
		t.Fatalf("events %d %d, want 2 3 (1 is held by the gateway)", a, b)
	}
	if log.LastAcked() != 1 {
		t.Errorf("Welcome's event_ack was not taken: acked %d", log.LastAcked())
	}
	p.send(t, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Ack{Ack: &bcdv1.Ack{EventSeq: 2}}})
	log.append(4)
	if s := nextEvent(t, p); s != 4 {
		t.Fatalf("appended event %d, want 4", s)
	}
	deadline := time.Now().Add(wait)
	for log.LastAcked() != 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if log.LastAcked() != 2 {
		t.Fatalf("the gateway's ack was not taken: %d", log.LastAcked())
	}
	p.end <- nil
	p2 := g.next(t)
	if p2.hello.GetLastAckedEvent() != 2 {
		t.Errorf("Hello.last_acked_event %d, want 2", p2.hello.GetLastAckedEvent())
	}
	p2.send(t, welcome(2, time.Now()))
	if a, b := nextEvent(t, p2), nextEvent(t, p2); a != 3 || b != 4 {
		t.Errorf("second session sent %d %d, want the unacked 3 4", a, b)
	}
}

// TestReportAndHeartbeatHooks: the latest report goes out after each
// Welcome and whenever a newer one is given; Hello and heartbeats carry
// what the hooks add.
func TestReportAndHeartbeatHooks(t *testing.T) {
	g, client := startFake(t)
	var beats sync.Map
	s := session.New(session.Config{Client: client, NodeID: "n1", Role: "node", BootID: "b", Version: "t",
		Dispatcher: dispatcherFor(t, "n1", newRunner(), 1, nil), BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		Hello: func(h *bcdv1.Hello) { h.AppliedGeneration, h.ObservedGeneration = 7, 6 },
		Heartbeat: func(hb *bcdv1.Heartbeat, beat int) {
			hb.AppliedGeneration = 7
			beats.Store(beat, true)
		},
	})
	s.Report(&bcdv1.StatusReport{ObservedGeneration: 6})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	p := g.next(t)
	if p.hello.GetAppliedGeneration() != 7 || p.hello.GetObservedGeneration() != 6 {
		t.Errorf("Hello %v", p.hello)
	}
	w := welcome(1, time.Now())
	w.GetWelcome().HeartbeatSeconds = 1
	p.send(t, w)
	if r := p.recv(t).GetStatus(); r.GetObservedGeneration() != 6 {
		t.Fatalf("first frame after Welcome: %v, want the held report", r)
	}
	s.Report(&bcdv1.StatusReport{ObservedGeneration: 7})
	if r := p.recv(t).GetStatus(); r.GetObservedGeneration() != 7 {
		t.Fatalf("newer report: %v", r)
	}
	deadline := time.After(wait)
	for {
		select {
		case f := <-p.frames:
			if hb := f.GetHeartbeat(); hb != nil {
				if hb.GetAppliedGeneration() != 7 {
					t.Errorf("heartbeat %v", hb)
				}
				if _, ok := beats.Load(0); !ok {
					t.Error("the first heartbeat is not beat 0")
				}
				return
			}
		case <-deadline:
			t.Fatal("no heartbeat")
		}
	}
}

// TestSealedSecretAndWorkloadToken: the session signs its requests with
// the node key, and opens only the sealed answer to the request it made;
// an answer sealed for another request does not open.
func TestSealedSecretAndWorkloadToken(t *testing.T) {
	g, client := startFake(t)
	nodeKey, _ := pki.GenerateKey()
	s := session.New(session.Config{Client: client, NodeID: "n1", Role: "node", BootID: "b", Version: "t",
		Dispatcher: dispatcherFor(t, "n1", newRunner(), 1, nil), BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		NodeKey: func() crypto.Signer { return nodeKey }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	p := g.next(t)
	p.send(t, welcome(1, time.Now()))

	type res struct {
		v   string
		err error
	}
	got := make(chan res, 1)
	go func() { v, err := s.WorkloadToken(ctx, "aud"); got <- res{v, err} }()
	req := p.recv(t).GetWorkloadTokenRequest()
	if err := seal.VerifyWorkloadRequest(nodeKey.Public(), "n1", req); err != nil {
		t.Fatalf("the request is not node-signed: %v", err)
	}
	sealed, _ := seal.SealTo(req.GetReplyKey(), req.GetRequestId(), []byte("jwt.for.aud"), time.Now())
	p.send(t, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_WorkloadTokenAnswer{WorkloadTokenAnswer: &bcdv1.WorkloadTokenAnswer{RequestId: req.GetRequestId(), Sealed: sealed}}})
	if r := <-got; r.err != nil || r.v != "jwt.for.aud" {
		t.Fatalf("WorkloadToken = %q, %v", r.v, r.err)
	}

	// A secret answer sealed to another request's key, under this one's id.
	gotS := make(chan res, 1)
	go func() { v, err := s.Secret(ctx, "x", "w", "c"); gotS <- res{string(v), err} }()
	sreq := p.recv(t).GetSecretRequest()
	if err := seal.VerifyRequest(nodeKey.Public(), "n1", sreq); err != nil {
		t.Fatalf("the secret request is not node-signed: %v", err)
	}
	otherReq := &bcdv1.SecretRequest{RequestId: sreq.GetRequestId()}
	if _, err := seal.NewRequest(nodeKey, "n1", otherReq, time.Now()); err != nil {
		t.Fatal(err)
	}
	wrong, _ := seal.Seal(otherReq, []byte("s3cret"), time.Now())
	p.send(t, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_SecretAnswer{SecretAnswer: &bcdv1.SecretAnswer{RequestId: sreq.GetRequestId(), Sealed: wrong}}})
	if r := <-gotS; r.err == nil || r.v != "" {
		t.Errorf("an answer sealed to another key opened: %q %v", r.v, r.err)
	}
}

// TestCancelVerified: a Cancel the signed-intent check refuses leaves the
// command running; one it accepts cancels it.
func TestCancelVerified(t *testing.T) {
	g, client := startFake(t)
	r := newRunner()
	startAgent(t, session.Config{Client: client, NodeID: "n1", Dispatcher: dispatcherFor(t, "n1", r, 2, nil),
		VerifyCancel: func(c *bcdv1.Cancel) error {
			if string(c.GetSignature()) != "ok" {
				return errors.New("BAD_SIGNATURE")
			}
			return nil
		}})
	p := g.next(t)
	p.send(t, welcome(1, time.Now()))
	for _, id := range []string{"c1", "c2"} {
		c := command(id, "n1", time.Now().Add(time.Minute), nil)
		c.GetCommand().Kind = "block"
		p.send(t, c)
		<-r.started
	}
	p.send(t, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Cancel{Cancel: &bcdv1.Cancel{CommandId: "c1", Reason: "forged"}}})
	p.send(t, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Cancel{Cancel: &bcdv1.Cancel{CommandId: "c2", Reason: "op", Signature: []byte("ok")}}})
	var c2 *bcdv1.CommandResult
	for c2 == nil {
		if res := p.recv(t).GetResult(); res != nil && res.GetCommandId() == "c2" {
			c2 = res
		}
	}
	if c2.GetStatus() != "CANCELLED" {
		t.Errorf("the verified cancel: %v", c2)
	}
	close(r.release)
	for {
		if res := p.recv(t).GetResult(); res != nil && res.GetCommandId() == "c1" {
			if res.GetStatus() != "SUCCEEDED" {
				t.Errorf("a refused cancel ended the command: %v", res)
			}
			return
		}
	}
}

// TestTrustAckSurvivesANewerReport: a report that acknowledges a newly
// taken trust bundle and is replaced before it was sent passes its
// trust_version to the report that replaces it; once sent, later reports
// do not repeat it.
func TestTrustAckSurvivesANewerReport(t *testing.T) {
	g, client := startFake(t)
	s := session.New(session.Config{Client: client, NodeID: "n1", Role: "node", BootID: "b", Version: "t",
		Dispatcher: dispatcherFor(t, "n1", newRunner(), 1, nil), BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	s.Report(&bcdv1.StatusReport{ObservedGeneration: 1, TrustVersion: 5})
	s.Report(&bcdv1.StatusReport{ObservedGeneration: 2})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	p := g.next(t)
	p.send(t, welcome(1, time.Now()))
	if r := p.recv(t).GetStatus(); r.GetObservedGeneration() != 2 || r.GetTrustVersion() != 5 {
		t.Fatalf("first report after Welcome: %v, want generation 2 with trust_version 5", r)
	}
	s.Report(&bcdv1.StatusReport{ObservedGeneration: 3})
	if r := p.recv(t).GetStatus(); r.GetObservedGeneration() != 3 || r.GetTrustVersion() != 0 {
		t.Fatalf("report after the acknowledgement was sent: %v, want generation 3 without trust_version", r)
	}
}
