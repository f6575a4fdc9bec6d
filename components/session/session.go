// Package session runs an agent's one long-lived stream to its gateway:
// Hello, Welcome (with the time mark check), heartbeats, commands in and
// results out, Drain and RevocationNotice, and redialing with full-jitter
// back-off (or the gateway's pushback) whenever the stream ends.
package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/clock"
	"github.com/better-compute/bcd/components/join"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// ErrRevoked ends Run when the gateway says this node's certificate was
// revoked.
var ErrRevoked = errors.New("agent: this node's certificate was revoked")

// MaxBody is the largest command body accepted.
const MaxBody = 1 << 20

// Runner executes commands. Run is called from a fixed pool of workers.
type Runner interface {
	Kinds() []string
	Run(ctx context.Context, cmd *bcdv1.Command) *bcdv1.CommandResult
}

// Config configures a session.
type Config struct {
	Client  bcdv1connect.AgentGatewayClient
	NodeID  string
	Role    string
	BootID  string
	Version string
	Runner  Runner
	Clock   *clock.Clock
	Log     *slog.Logger
	Workers int // default 4
	// Back-off between failed dials: full jitter up to min(Max, Base*2^n).
	BackoffBase, BackoffMax time.Duration
	// OnWelcome, when set, is told each accepted session's epoch.
	OnWelcome func(epoch uint64)
}

// Session is the agent's state across redials.
type Session struct {
	cfg     Config
	log     *slog.Logger
	queue   chan *bcdv1.Command
	results chan *bcdv1.CommandResult

	mu      sync.Mutex
	seen    map[string]bool                 // command ids accepted (the journal makes this durable in a later layer)
	unacked map[string]*bcdv1.CommandResult // results not yet acked by the gateway
	running map[string]bool
}

// New prepares a session; Run starts it.
func New(cfg Config) *Session {
	if cfg.Workers == 0 {
		cfg.Workers = 4
	}
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
	return &Session{
		cfg: cfg, log: cfg.Log.With("component", "session"),
		queue: make(chan *bcdv1.Command, 256), results: make(chan *bcdv1.CommandResult, 256),
		seen: map[string]bool{}, unacked: map[string]*bcdv1.CommandResult{}, running: map[string]bool{},
	}
}

// Run dials, serves and redials until ctx ends (nil) or the node is
// revoked (ErrRevoked).
func (s *Session) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	for range s.cfg.Workers {
		wg.Add(1)
		go func() { defer wg.Done(); s.worker(wctx) }()
	}
	failures := 0
	for {
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
			if p, ok := join.Pushback(err); ok {
				wait = p
			} else {
				wait = join.Backoff(failures, s.cfg.BackoffBase, s.cfg.BackoffMax)
				failures++
			}
		}
		if err != nil {
			s.log.Warn("session ended; redialing", "err", errText(err), "retry_in", wait.Round(time.Millisecond).String())
		} else {
			s.log.Info("session ended; redialing", "retry_in", wait.Round(time.Millisecond).String())
		}
		if join.SleepCtx(ctx, wait) != nil {
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
	s.mu.Lock()
	var inflight []string
	for id := range s.running {
		inflight = append(inflight, id)
	}
	s.mu.Unlock()
	return &bcdv1.Hello{
		NodeId: s.cfg.NodeID, BootId: s.cfg.BootID, Role: s.cfg.Role, Version: s.cfg.Version,
		InFlight: inflight, Kinds: s.cfg.Runner.Kinds(),
		Lanes: []*bcdv1.LaneCredit{{Lane: "control", Size: uint32(s.cfg.Workers), Free: uint32(s.cfg.Workers - len(inflight))}},
	}
}

// once runs one session. It reports whether a Welcome was accepted, how
// long to wait before redialing when the gateway said (Drain), and why it
// ended.
func (s *Session) once(ctx context.Context) (welcomed bool, wait time.Duration, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := s.cfg.Client.Session(sctx)
	defer func() { _ = st.CloseRequest(); _ = st.CloseResponse() }()
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
	if s.cfg.OnWelcome != nil {
		s.cfg.OnWelcome(w.GetEpoch())
	}
	hb := time.Duration(w.GetHeartbeatSeconds()) * time.Second
	if hb <= 0 {
		hb = 15 * time.Second
	}
	// Results the last session did not see acked go out again.
	s.mu.Lock()
	var resend []*bcdv1.CommandResult
	for _, r := range s.unacked {
		resend = append(resend, r)
	}
	s.mu.Unlock()
	for _, r := range resend {
		if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: r}}); err != nil {
			return true, 0, err
		}
	}

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
		case err := <-recvErr:
			return true, 0, err
		case <-tick.C:
			if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Heartbeat{Heartbeat: &bcdv1.Heartbeat{
				SentUnixMs: s.cfg.Clock.Now().UnixMilli(), Lanes: s.hello().GetLanes(),
			}}}); err != nil {
				return true, 0, err
			}
		case r := <-s.results:
			if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: r}}); err != nil {
				return true, 0, err
			}
		case f := <-frames:
			switch x := f.Frame.(type) {
			case *bcdv1.GatewayFrame_Command:
				if err := s.accept(st, x.Command); err != nil {
					return true, 0, err
				}
			case *bcdv1.GatewayFrame_Ack:
				s.mu.Lock()
				for _, id := range x.Ack.GetResultIds() {
					delete(s.unacked, id)
				}
				s.mu.Unlock()
			case *bcdv1.GatewayFrame_Drain:
				d := time.Duration(x.Drain.GetRedialAfterMs()) * time.Millisecond
				s.log.Info("gateway asked to drain", "reason", x.Drain.GetReason())
				return true, d + join.Backoff(0, time.Second, time.Second), nil
			case *bcdv1.GatewayFrame_Revocation:
				return true, 0, ErrRevoked
			default:
				// Frames of later features (Cancel, DesiredState, OpenTunnel...)
				// are ignored by this layer.
			}
		}
	}
}

// accept applies the acceptance rules to a delivered command: acked at
// once, refused when it is not for this node or past its deadline, run at
// most once per id.
func (s *Session) accept(st *connect.BidiStreamForClient[bcdv1.AgentFrame, bcdv1.GatewayFrame], c *bcdv1.Command) error {
	log := s.log.With("command_id", c.GetId(), "kind", c.GetKind())
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Ack{Ack: &bcdv1.Ack{CommandIds: []string{c.GetId()}}}}); err != nil {
		return err
	}
	s.mu.Lock()
	dup := s.seen[c.GetId()]
	if !dup {
		s.seen[c.GetId()] = true
	}
	s.mu.Unlock()
	if dup {
		log.Info("command already accepted; not run again")
		return nil
	}
	now := s.cfg.Clock.Now()
	var refuse string
	switch {
	case c.GetNodeId() != s.cfg.NodeID:
		refuse = "command is for another node"
	case c.GetDeadlineUnixMs() != 0 && now.UnixMilli() > c.GetDeadlineUnixMs():
		refuse = "command is past its deadline"
	case len(c.GetBody()) > MaxBody:
		refuse = "command body is larger than 1 MiB"
	}
	if refuse != "" {
		log.Warn("command refused", "reason", refuse)
		s.finish(&bcdv1.CommandResult{CommandId: c.GetId(), Status: "REFUSED", Error: refuse, StartedUnixMs: now.UnixMilli(), FinishedUnixMs: now.UnixMilli()})
		return nil
	}
	select {
	case s.queue <- c:
		s.mu.Lock()
		s.running[c.GetId()] = true
		s.mu.Unlock()
	default:
		s.finish(&bcdv1.CommandResult{CommandId: c.GetId(), Status: "REFUSED", Error: "agent queue is full", StartedUnixMs: now.UnixMilli(), FinishedUnixMs: now.UnixMilli()})
	}
	return nil
}

func (s *Session) finish(r *bcdv1.CommandResult) {
	s.mu.Lock()
	s.unacked[r.GetCommandId()] = r
	delete(s.running, r.GetCommandId())
	s.mu.Unlock()
	select {
	case s.results <- r:
	default:
		// The session is busy or gone: the result waits in unacked and goes
		// out after the next Welcome.
	}
}

func (s *Session) worker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-s.queue:
			start := s.cfg.Clock.Now()
			s.log.Info("command started", "command_id", c.GetId(), "kind", c.GetKind())
			r := s.cfg.Runner.Run(ctx, c)
			r.CommandId = c.GetId()
			if r.StartedUnixMs == 0 {
				r.StartedUnixMs = start.UnixMilli()
			}
			r.FinishedUnixMs = s.cfg.Clock.Now().UnixMilli()
			s.log.Info("command finished", "command_id", c.GetId(), "kind", c.GetKind(), "status", r.GetStatus())
			s.finish(r)
		}
	}
}
