// Package session runs an agent's one long-lived stream to its gateway:
// Hello, Welcome (with the time mark check), heartbeats, commands in and
// results out, Drain and RevocationNotice, and redialing with full-jitter
// back-off (or the gateway's pushback) whenever the stream ends.
package session

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/agent/clock"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/base/backoff"
	"github.com/better-compute/bcd/components/trust/seal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// ErrRevoked ends Run when the gateway says this node's certificate was
// revoked.
var ErrRevoked = errors.New("agent: this node's certificate was revoked")

// Dispatcher takes delivered commands and owns their results: the
// session hands it commands, reads results from it, and tells it the
// gateway's acks (components/agent/dispatch implements it over the journal).
type Dispatcher interface {
	Kinds() []string
	Credits() []*bcdv1.LaneCredit
	InFlight() []string
	// Deliver returns once the command is durably accepted (or refused);
	// only then does the session ack it.
	Deliver(*bcdv1.Command) error
	Cancel(id, reason string)
	// Unacked lists stored results the gateway has not acked yet.
	Unacked() []*bcdv1.CommandResult
	Acked(ids []string)
	// Notify is signalled when a new result is stored.
	Notify() <-chan struct{}
}

// Stream is one session's frames: the Session RPC over HTTP/2, or the
// WebSocket fallback (components/agent/transport).
type Stream interface {
	Send(*bcdv1.AgentFrame) error
	Receive() (*bcdv1.GatewayFrame, error)
	Close()
}

// rpcStream is the Session RPC as a Stream.
type rpcStream struct {
	*connect.BidiStreamForClient[bcdv1.AgentFrame, bcdv1.GatewayFrame]
}

func (r rpcStream) Close() { _ = r.CloseRequest(); _ = r.CloseResponse() }

// Config configures a session.
type Config struct {
	Client bcdv1connect.AgentGatewayClient
	// Dial, when set, opens each session's stream instead of the Session
	// RPC of Client (the WebSocket fallback).
	Dial func(ctx context.Context) (Stream, error)
	// AfterWelcome, when set, runs after OnWelcome, before any other frame
	// of the session is read; an error ends the session (the fallback
	// refuses to go on without command-signing roots).
	AfterWelcome func() error
	NodeID       string
	Role         string
	BootID       string
	Version      string
	Dispatcher   Dispatcher
	Clock        *clock.Clock
	Log          *slog.Logger
	// Back-off between failed dials: full jitter up to min(Max, Base*2^n).
	BackoffBase, BackoffMax time.Duration
	// OnWelcome, when set, is told each accepted Welcome before anything
	// is sent in that session (the reporter makes its report for it then).
	OnWelcome func(w *bcdv1.Welcome)
	// OnDesiredState, when set, gets each DesiredState with the working
	// clock's time on arrival.
	OnDesiredState func(ds *bcdv1.DesiredState, serverNow time.Time)
	// OnOpenTunnel, when set, is given each OpenTunnel; it must not block
	// (components/agent/tunnel opens the tunnel in the background).
	OnOpenTunnel func(ot *bcdv1.OpenTunnel)
	// Hello and Heartbeat, when set, add what other components know to
	// each Hello (generations) and heartbeat (generations, inventory
	// hashes); beat counts the heartbeats of this session from 0.
	Hello     func(h *bcdv1.Hello)
	Heartbeat func(hb *bcdv1.Heartbeat, beat int)
	// Events, when set, is the agent's event log: its unacked events go
	// out after each Welcome and as they are appended, until acked.
	Events EventLog
	// NodeKey returns the node key that signs secret requests (the
	// session's certificate key).
	NodeKey func() crypto.Signer
	// VerifyCancel, when set, checks a Cancel's signature (signed
	// intent); a Cancel it refuses is logged and ignored.
	VerifyCancel func(*bcdv1.Cancel) error
	// BeforeDial, when set, runs before every dial (the agent closes idle
	// connections there, so a renewed certificate is used at once).
	BeforeDial func()
	// Drivers, when set, lists the hosted drivers for each Hello.
	Drivers func() []*bcdv1.Driver
	// Capabilities, when set, says for each Hello what the host offers
	// (the instances' runtime and acceleration).
	Capabilities func() []string
}

// EventLog is the agent's durable log of events for the gateway
// (components/agent/journal holds it).
type EventLog interface {
	// Unacked returns the events not acked yet, oldest first.
	Unacked() ([]*bcdv1.Event, error)
	// LastAcked is the highest sequence the gateway acked.
	LastAcked() uint64
	// Ack drops every event up to and including seq.
	Ack(seq uint64) error
	// Notify is signalled when an event is appended.
	Notify() <-chan struct{}
}

// Session is the agent's state across redials.
type Session struct {
	cfg    Config
	log    *slog.Logger
	kick   chan struct{}
	outbox chan *bcdv1.AgentFrame // frames other goroutines send (secret requests)

	secMu   sync.Mutex
	secWait map[string]chan sealedAnswer // secret and workload token requests by id
	secSeq  uint64

	repMu      sync.Mutex
	lastReport *bcdv1.StatusReport // the latest StatusReport, re-sent after each Welcome
	repSent    *bcdv1.StatusReport // the last report handed to a stream
	repKick    chan struct{}

	mu        sync.Mutex
	connected bool
	epoch     uint64
	since     time.Time
}

// State reports whether a session is established, its epoch and since
// when (for bcd status).
func (s *Session) State() (connected bool, epoch uint64, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected, s.epoch, s.since
}

func (s *Session) setState(connected bool, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected = connected
	if connected {
		s.epoch, s.since = epoch, time.Now()
	}
}

// Reconnect ends the current session and dials again at once (after a
// certificate renewal).
func (s *Session) Reconnect() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// New prepares a session; Run starts it.
func New(cfg Config) *Session {
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = time.Second
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock, _ = clock.Open("")
	}
	return &Session{cfg: cfg, log: cfg.Log.With("component", "session"), kick: make(chan struct{}, 1),
		outbox: make(chan *bcdv1.AgentFrame, 16), secWait: map[string]chan sealedAnswer{},
		repKick: make(chan struct{}, 1)}
}

// Run dials, serves and redials until ctx ends (nil) or the node is
// revoked (ErrRevoked).
func (s *Session) Run(ctx context.Context) error {
	failures := 0
	for {
		if s.cfg.BeforeDial != nil {
			s.cfg.BeforeDial()
		}
		welcomed, wait, err := s.once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrRevoked) {
			return err
		}
		if welcomed {
			failures = 0
		}
		if wait == 0 {
			if p, ok := backoff.Pushback(err); ok {
				// Spread out: a gateway that refuses thousands of agents at
				// once (its set-up queue in a failover) gets them back over
				// half the pushback again, not all at the same moment.
				wait = backoff.Jitter(p)
			} else {
				wait = backoff.Full(failures, s.cfg.BackoffBase, s.cfg.BackoffMax)
				failures++
			}
		}
		if err != nil {
			s.log.Warn("session ended; redialing", "err", errText(err), "retry_in", wait.Round(time.Millisecond).String())
		} else {
			s.log.Info("session ended; redialing", "retry_in", wait.Round(time.Millisecond).String())
		}
		if backoff.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

func errText(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code().String() + ": " + ce.Message()
	}
	return err.Error()
}

func (s *Session) hello() *bcdv1.Hello {
	d := s.cfg.Dispatcher
	h := &bcdv1.Hello{
		NodeId: s.cfg.NodeID, BootId: s.cfg.BootID, Role: s.cfg.Role, Version: s.cfg.Version,
		InFlight: d.InFlight(), Kinds: d.Kinds(), Lanes: d.Credits(),
	}
	if s.cfg.Drivers != nil {
		h.Drivers = s.cfg.Drivers()
	}
	if s.cfg.Capabilities != nil {
		h.Capabilities = s.cfg.Capabilities()
	}
	if s.cfg.Events != nil {
		h.LastAckedEvent = s.cfg.Events.LastAcked()
	}
	if s.cfg.Hello != nil {
		s.cfg.Hello(h)
	}
	return h
}

// once runs one session. It reports whether a Welcome was accepted, how
// long to wait before redialing when the gateway said (Drain), and why it
// ended.
func (s *Session) once(ctx context.Context) (welcomed bool, wait time.Duration, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var st Stream
	if s.cfg.Dial != nil {
		var err error
		if st, err = s.cfg.Dial(sctx); err != nil {
			return false, 0, err
		}
	} else {
		st = rpcStream{s.cfg.Client.Session(sctx)}
	}
	defer st.Close()
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Hello{Hello: s.hello()}}); err != nil {
		if _, rerr := st.Receive(); rerr != nil {
			return false, 0, rerr
		}
		return false, 0, err
	}
	first, err := st.Receive()
	if err != nil {
		return false, 0, err
	}
	if first.GetRevocation() != nil {
		return false, 0, ErrRevoked
	}
	w := first.GetWelcome()
	if w == nil {
		return false, 0, errors.New("the gateway's first frame was not Welcome")
	}
	if err := s.cfg.Clock.Accept(time.UnixMilli(w.GetServerTimeUnixMs())); err != nil {
		return false, 0, fmt.Errorf("Welcome refused: %w", err)
	}
	s.log.Info("session established", "epoch", w.GetEpoch())
	s.setState(true, w.GetEpoch())
	defer s.setState(false, 0)
	if s.cfg.OnWelcome != nil {
		s.cfg.OnWelcome(w)
	}
	if s.cfg.AfterWelcome != nil {
		if err := s.cfg.AfterWelcome(); err != nil {
			return false, 0, err
		}
	}
	hb := time.Duration(w.GetHeartbeatSeconds()) * time.Second
	if hb <= 0 {
		hb = 15 * time.Second
	}
	// Every result not acked goes out once per session: those a previous
	// session did not see acked now, new ones as they are stored; and again
	// in a later session until the gateway acks them.
	sent := map[string]bool{}
	sendResults := func() error {
		for _, r := range s.cfg.Dispatcher.Unacked() {
			if sent[r.GetCommandId()] {
				continue
			}
			if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: r}}); err != nil {
				return err
			}
			sent[r.GetCommandId()] = true
		}
		return nil
	}
	if err := sendResults(); err != nil {
		return true, 0, err
	}
	// The latest report goes out once per session, then again whenever a
	// newer one replaces it.
	sendReport := func() error {
		s.repMu.Lock()
		rep := s.lastReport
		s.repSent = rep
		s.repMu.Unlock()
		if rep == nil {
			return nil
		}
		return st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: rep}})
	}
	select {
	case <-s.repKick:
	default:
	}
	if err := sendReport(); err != nil {
		return true, 0, err
	}
	// Events the gateway holds (up to Welcome.event_ack) are done; the
	// rest go out in order, each once per session, until acked.
	var sentEvent uint64
	sendEvents := func() error {
		if s.cfg.Events == nil {
			return nil
		}
		evs, err := s.cfg.Events.Unacked()
		if err != nil {
			s.log.Error("reading the event log", "err", err)
			return nil
		}
		for _, ev := range evs {
			if ev.GetSeq() <= sentEvent {
				continue
			}
			if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Event{Event: ev}}); err != nil {
				return err
			}
			sentEvent = ev.GetSeq()
		}
		return nil
	}
	var events <-chan struct{}
	if s.cfg.Events != nil {
		events = s.cfg.Events.Notify()
		if a := w.GetEventAck(); a > 0 {
			if err := s.cfg.Events.Ack(a); err != nil {
				s.log.Error("acking events the gateway holds", "err", err)
			}
			sentEvent = a
		}
		if err := sendEvents(); err != nil {
			return true, 0, err
		}
	}
	beat := 0

	frames := make(chan *bcdv1.GatewayFrame)
	recvErr := make(chan error, 1)
	go func() {
		for {
			f, err := st.Receive()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case frames <- f:
			case <-sctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(hb)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return true, 0, nil
		case f := <-s.outbox:
			if err := st.Send(f); err != nil {
				return true, 0, err
			}
		case <-s.kick:
			s.log.Info("reconnecting with the renewed certificate")
			return true, time.Millisecond, nil
		case err := <-recvErr:
			return true, 0, err
		case <-s.repKick:
			if err := sendReport(); err != nil {
				return true, 0, err
			}
		case <-events:
			if err := sendEvents(); err != nil {
				return true, 0, err
			}
		case <-tick.C:
			hb := &bcdv1.Heartbeat{SentUnixMs: s.cfg.Clock.Now().UnixMilli(), Lanes: s.cfg.Dispatcher.Credits()}
			if s.cfg.Heartbeat != nil {
				s.cfg.Heartbeat(hb, beat)
			}
			beat++
			if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Heartbeat{Heartbeat: hb}}); err != nil {
				return true, 0, err
			}
			// A missed notification costs at most one heartbeat.
			if err := sendResults(); err != nil {
				return true, 0, err
			}
		case <-s.cfg.Dispatcher.Notify():
			if err := sendResults(); err != nil {
				return true, 0, err
			}
		case f := <-frames:
			switch x := f.Frame.(type) {
			case *bcdv1.GatewayFrame_Command:
				if err := s.accept(st, x.Command); err != nil {
					return true, 0, err
				}
			case *bcdv1.GatewayFrame_Ack:
				s.cfg.Dispatcher.Acked(x.Ack.GetResultIds())
				if seq := x.Ack.GetEventSeq(); seq > 0 && s.cfg.Events != nil {
					if err := s.cfg.Events.Ack(seq); err != nil {
						s.log.Error("acking an event", "seq", seq, "err", err)
					}
				}
			case *bcdv1.GatewayFrame_Cancel:
				if s.cfg.VerifyCancel != nil {
					if err := s.cfg.VerifyCancel(x.Cancel); err != nil {
						s.log.Warn("cancel refused; the command goes on", "command_id", x.Cancel.GetCommandId(), "err", err)
						continue
					}
				}
				s.cfg.Dispatcher.Cancel(x.Cancel.GetCommandId(), x.Cancel.GetReason())
			case *bcdv1.GatewayFrame_SecretAnswer:
				s.answered(x.SecretAnswer.GetRequestId(), x.SecretAnswer)
			case *bcdv1.GatewayFrame_WorkloadTokenAnswer:
				s.answered(x.WorkloadTokenAnswer.GetRequestId(), x.WorkloadTokenAnswer)
			case *bcdv1.GatewayFrame_DesiredState:
				if s.cfg.OnDesiredState != nil {
					s.cfg.OnDesiredState(x.DesiredState, s.cfg.Clock.Now())
				}
			case *bcdv1.GatewayFrame_Drain:
				d := time.Duration(x.Drain.GetRedialAfterMs()) * time.Millisecond
				s.log.Info("gateway asked to drain", "reason", x.Drain.GetReason())
				return true, d + backoff.Full(0, time.Second, time.Second), nil
			case *bcdv1.GatewayFrame_Revocation:
				return true, 0, ErrRevoked
			case *bcdv1.GatewayFrame_OpenTunnel:
				if s.cfg.OnOpenTunnel != nil {
					s.cfg.OnOpenTunnel(x.OpenTunnel)
				}
			default:
				// Frames of later features (OpenTunnel, SecretAnswer...)
				// are ignored by this layer.
			}
		}
	}
}

// accept hands a delivered command to the dispatcher, which journals it
// (or its refusal) before the session acks it. A command the journal could
// not take is not acked: the gateway sends it again.
func (s *Session) accept(st Stream, c *bcdv1.Command) error {
	if err := s.cfg.Dispatcher.Deliver(c); err != nil {
		s.log.Error("command not accepted; the gateway will send it again", "command_id", c.GetId(), "kind", c.GetKind(), "err", err)
		return nil
	}
	return st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Ack{Ack: &bcdv1.Ack{CommandIds: []string{c.GetId()}}}})
}

// SecretTimeout bounds how long Secret waits for the gateway's answer.
const SecretTimeout = 30 * time.Second

// Secret asks the gateway for a secret bound to a workflow step (the
// command that needs it) and waits for the answer. The request is signed
// by the node key and carries a reply key made for it alone; the answer
// opens only with that key, for that request, within 10 s
// (components/trust/seal). The secret is never logged; the caller clears
// it after use.
func (s *Session) Secret(ctx context.Context, name, workflowID, commandID string) ([]byte, error) {
	v, err := s.ask(ctx, "sec", func(id string, key crypto.Signer) (*bcdv1.AgentFrame, *seal.Opener, error) {
		sr := &bcdv1.SecretRequest{RequestId: id, Name: name, WorkflowId: workflowID, CommandId: commandID}
		o, err := seal.NewRequest(key, s.cfg.NodeID, sr, time.Now())
		return &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_SecretRequest{SecretRequest: sr}}, o, err
	})
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", name, err)
	}
	return v, nil
}

// WorkloadToken asks the gateway for a short-lived token (a JWT it signs)
// for audience, sealed like a secret: the request is signed by the node
// key and the answer opens only with the reply key made for it, within
// 10 s. The metadata service hands such tokens to workloads.
func (s *Session) WorkloadToken(ctx context.Context, audience string) (string, error) {
	return s.InstanceToken(ctx, "", audience)
}

// InstanceToken is WorkloadToken for an instance of this node (the
// metadata service's identity tokens): the gateway answers only for an
// instance the node's desired spec runs, and its token names it. An empty
// instance asks for the node's own token.
func (s *Session) InstanceToken(ctx context.Context, instance, audience string) (string, error) {
	v, err := s.ask(ctx, "wt", func(id string, key crypto.Signer) (*bcdv1.AgentFrame, *seal.Opener, error) {
		wr := &bcdv1.WorkloadTokenRequest{RequestId: id, Audience: audience, Instance: instance}
		o, err := seal.NewWorkloadRequest(key, s.cfg.NodeID, wr, time.Now())
		return &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_WorkloadTokenRequest{WorkloadTokenRequest: wr}}, o, err
	})
	if err != nil {
		return "", fmt.Errorf("workload token: %w", err)
	}
	return string(v), nil
}

// sealedAnswer is a SecretAnswer or a WorkloadTokenAnswer.
type sealedAnswer interface {
	GetError() string
	GetSealed() string
}

// ask sends the sealed request build makes for a fresh request id and
// waits, at most SecretTimeout, for its answer, which it opens.
func (s *Session) ask(ctx context.Context, prefix string, build func(id string, nodeKey crypto.Signer) (*bcdv1.AgentFrame, *seal.Opener, error)) ([]byte, error) {
	if s.cfg.NodeKey == nil {
		return nil, errors.New("this agent has no node key to sign the request with")
	}
	s.secMu.Lock()
	s.secSeq++
	id := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano(), s.secSeq)
	ch := make(chan sealedAnswer, 1)
	s.secWait[id] = ch
	s.secMu.Unlock()
	defer func() {
		s.secMu.Lock()
		delete(s.secWait, id)
		s.secMu.Unlock()
	}()
	f, opener, err := build(id, s.cfg.NodeKey())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, SecretTimeout)
	defer cancel()
	select {
	case s.outbox <- f:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case a := <-ch:
		if a.GetError() != "" {
			return nil, fmt.Errorf("the gateway refused: %s", a.GetError())
		}
		return opener.OpenSealed(a.GetSealed(), time.Now())
	case <-ctx.Done():
		return nil, fmt.Errorf("no answer: %w", ctx.Err())
	}
}

// answered hands an answer to the request waiting for it, if any.
func (s *Session) answered(id string, a sealedAnswer) {
	s.secMu.Lock()
	ch := s.secWait[id]
	delete(s.secWait, id)
	s.secMu.Unlock()
	if ch != nil {
		ch <- a
	}
}

type secretsKey struct{}

// Secrets is what a command kind uses to ask for secrets.
type Secrets interface {
	Secret(ctx context.Context, name, workflowID, commandID string) ([]byte, error)
}

// WithSecrets returns ctx carrying s for the kinds run under it.
func WithSecrets(ctx context.Context, s Secrets) context.Context {
	return context.WithValue(ctx, secretsKey{}, s)
}

// SecretsFrom returns the Secrets a kind may use, or nil.
func SecretsFrom(ctx context.Context) Secrets {
	s, _ := ctx.Value(secretsKey{}).(Secrets)
	return s
}

// CommandSecret asks the gateway for the secret name bound to the command
// the context runs (its id names both the workflow and the step).
func CommandSecret(ctx context.Context, name string) ([]byte, error) {
	s := SecretsFrom(ctx)
	if s == nil {
		return nil, errors.New("no session to ask the gateway for " + name)
	}
	id := dispatch.CommandID(ctx)
	return s.Secret(ctx, name, id, id)
}

// Report sends r now if a session is up, and again after every later
// Welcome until a newer report replaces it. Reports are complete, so a
// newer one replaces an older one not sent yet.
//
// A report's trust_version says once that the agent took a newer trust
// bundle; a newer report that replaces one not sent yet keeps it, so the
// acknowledgement is never dropped by a report built right after it.
func (s *Session) Report(r *bcdv1.StatusReport) {
	s.repMu.Lock()
	if old := s.lastReport; old != nil && old != s.repSent && old.GetTrustVersion() > r.GetTrustVersion() {
		r.TrustVersion = old.GetTrustVersion()
	}
	s.lastReport = r
	s.repMu.Unlock()
	select {
	case s.repKick <- struct{}{}:
	default: // already due
	}
}
