package gateway

import (
	"context"
	"crypto"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/intent"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// outFrame is a frame queued for a session; a final frame ends it once sent.
type outFrame struct {
	f     *bcdv1.GatewayFrame
	final bool
}

// live is one accepted session.
type live struct {
	// nodeKey is the public key of the certificate the session runs
	// under: the node key that attests results.
	nodeKey crypto.PublicKey
	nodeID  string
	role    string
	site    string
	epoch   uint64
	out     chan outFrame
	done    chan struct{}
	once    sync.Once
	// specReady is set once the session sent what its Hello asked of the
	// desired spec; spec changes are pushed to it only from then on (before,
	// the full spec it gets covers them).
	specReady atomic.Bool
	// fullGen is the generation of the last full spec sent on this session.
	fullGen atomic.Uint64
	// beat is what this session last wrote of its heartbeats (heartbeat.go).
	beat beatState
}

func (l *live) close() { l.once.Do(func() { close(l.done) }) }

// push queues a frame unless the session has ended.
func (l *live) push(f outFrame) {
	select {
	case l.out <- f:
	case <-l.done:
	}
}

// hub tracks the live session of each node.
type hub struct {
	mu       sync.Mutex
	sessions map[string]*live
	reserved int // sessions past the limit check, not yet registered
	draining bool
}

// reserve holds a place for a session under the limit (0: none) until
// release; a node that already has a session may always replace it.
func (h *hub) reserve(nodeID string, limit int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if limit > 0 && h.sessions[nodeID] == nil && len(h.sessions)+h.reserved >= limit {
		return false
	}
	h.reserved++
	return true
}

func (h *hub) release() {
	h.mu.Lock()
	h.reserved--
	h.mu.Unlock()
}

func newHub() *hub { return &hub{sessions: map[string]*live{}} }

// register makes l the node's session, ending any older one.
func (h *hub) register(l *live) (count int, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining {
		return 0, false
	}
	if old := h.sessions[l.nodeID]; old != nil {
		old.close()
	}
	h.sessions[l.nodeID] = l
	return len(h.sessions), true
}

func (h *hub) unregister(l *live) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions[l.nodeID] == l {
		delete(h.sessions, l.nodeID)
	}
}

func (h *hub) isDraining() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.draining
}

func (h *hub) all() []*live {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*live, 0, len(h.sessions))
	for _, l := range h.sessions {
		out = append(out, l)
	}
	return out
}

func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

func (h *hub) get(nodeID string) *live {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sessions[nodeID]
}

func (h *hub) connected(nodeID string) bool { return h.get(nodeID) != nil }

func (h *hub) send(nodeID string, f *bcdv1.GatewayFrame) {
	if l := h.get(nodeID); l != nil {
		go l.push(outFrame{f: f})
	}
}

func (h *hub) sendFinal(nodeID string, f *bcdv1.GatewayFrame) {
	if l := h.get(nodeID); l != nil {
		l.push(outFrame{f: f, final: true})
	}
}

// drainAll sends Drain to every session and refuses new ones.
func (h *hub) drainAll(reason string) int {
	h.mu.Lock()
	h.draining = true
	all := make([]*live, 0, len(h.sessions))
	for _, l := range h.sessions {
		all = append(all, l)
	}
	h.mu.Unlock()
	return drain(all, reason, 500*time.Millisecond)
}

// drainLive sends Drain to every live session (each agent redials after
// redial plus its jitter) and goes on accepting new ones.
func (h *hub) drainLive(reason string, redial time.Duration) int {
	return drain(h.all(), reason, redial)
}

// drain queues a final Drain on each session and waits (up to 2 s) until
// each is sent or the session ended.
func drain(all []*live, reason string, redial time.Duration) int {
	var wg sync.WaitGroup
	for _, l := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Drain{Drain: &bcdv1.Drain{Reason: reason, RedialAfterMs: uint32(redial.Milliseconds())}}}
			select {
			case l.out <- outFrame{f: f, final: true}:
				// Wait until the sender wrote it, or give up.
				select {
				case <-l.done:
				case <-time.After(2 * time.Second):
				}
			case <-l.done:
			case <-time.After(2 * time.Second):
			}
		}()
	}
	wg.Wait()
	return len(all)
}

// busy refuses a session with a retry pushback the agent honours.
func (s *Server) busy() error {
	err := connect.NewError(connect.CodeResourceExhausted, errors.New("gateway is at its session limit; retry later"))
	err.Meta().Set("grpc-retry-pushback-ms", strconv.FormatInt(s.cfg.Pushback.Milliseconds(), 10))
	return err
}

// Session serves one agent's stream.
func (s *Server) Session(ctx context.Context, st *connect.BidiStream[bcdv1.AgentFrame, bcdv1.GatewayFrame]) error {
	n, cert, err := s.peerNode(ctx)
	if err != nil {
		return err
	}
	log := s.log.With("node", n.ID, "rpc", "Session")
	if n.Revoked {
		log.Info("session refused", "reason", "revoked")
		return st.Send(revocationFrame())
	}
	serial := cert.SerialNumber.Text(16)
	if !n.Current(serial) {
		return connectErr(connect.CodeUnauthenticated, "certificate was superseded by a renewal")
	}
	if serial == n.CertSerial && n.PrevCertSerial != "" {
		// The renewed certificate is in use: the one before it is done.
		_, _ = s.store.UpdateNode(n.ID, func(x *store.Node) error {
			if x.CertSerial == serial {
				x.PrevCertSerial = ""
			}
			return nil
		})
	}
	if !s.hub.reserve(n.ID, s.cfg.MaxSessions) {
		log.Warn("session refused", "reason", "busy", "sessions", s.hub.count())
		return s.busy()
	}
	reserved := true
	defer func() {
		if reserved {
			s.hub.release()
		}
	}()
	first, err := st.Receive()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return connectErr(connect.CodeInvalidArgument, "the first frame must be Hello")
	}
	if hello.GetNodeId() != n.ID {
		return connectErr(connect.CodePermissionDenied, "Hello names node %s but the certificate is for %s", hello.GetNodeId(), n.ID)
	}
	if s.hub.isDraining() {
		return connectErr(connect.CodeUnavailable, "gateway is draining")
	}
	epoch, err := s.store.NextEpoch(n.ID, s.now().UTC())
	if err != nil {
		return connectErr(connect.CodeUnavailable, "store: %v", err)
	}
	l := &live{nodeKey: cert.PublicKey, nodeID: n.ID, role: n.Role, site: n.Site, epoch: epoch, out: make(chan outFrame, 64), done: make(chan struct{})}
	_, ok := s.hub.register(l)
	s.hub.release()
	reserved = false
	if !ok {
		return connectErr(connect.CodeUnavailable, "gateway is draining")
	}
	defer s.hub.unregister(l)
	defer l.close()
	if s.shared != nil {
		// A session of this node left on another gateway (half-open, its
		// agent gone) ends there (shared.go).
		go s.notify(store.Notice{Kind: store.NoticeSession, Node: n.ID, Epoch: epoch})
	}
	log = log.With("epoch", epoch)
	log.Info("session accepted", "boot_id", hello.GetBootId(), "role", hello.GetRole(), "version", hello.GetVersion(),
		"applied_generation", hello.GetAppliedGeneration(), "observed_generation", hello.GetObservedGeneration(),
		"trust_bundle_version", hello.GetTrustBundleVersion())
	if _, err := s.store.UpdateNode(n.ID, func(x *store.Node) error {
		x.AppliedGeneration, x.ObservedGeneration = hello.GetAppliedGeneration(), hello.GetObservedGeneration()
		x.TrustVersion, x.TrustVersionAt = hello.GetTrustBundleVersion(), s.now().UTC()
		if x.Epoch == epoch {
			x.Gateway = s.cfg.Name
		}
		return nil
	}); err != nil {
		return connectErr(connect.CodeUnavailable, "store: %v", err)
	}
	if s.shared != nil {
		defer s.sessionEnded(n.ID, epoch, log)
	}
	l.beat.helloStored(time.Time{}, hello.GetAppliedGeneration(), hello.GetObservedGeneration())

	if err := st.Send(&bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Welcome{Welcome: &bcdv1.Welcome{
		Epoch: epoch, ServerTimeUnixMs: s.now().UnixMilli(), HeartbeatSeconds: uint32(s.cfg.Heartbeat / time.Second),
		EventAck: hello.GetLastAckedEvent(), RequestedSections: s.missingInventory(n.ID),
		// Read after the session registered: a bundle changed since is
		// either in this Welcome or followed by a Drain (changeTrust).
		TrustBundle: s.TrustBundle(),
	}}}); err != nil {
		return err
	}
	pending, err := s.store.Unfinished(n.ID)
	if err != nil {
		return connectErr(connect.CodeUnavailable, "store: %v", err)
	}
	for _, c := range pending {
		if err := st.Send(commandFrame(c)); err != nil {
			return err
		}
	}
	if err := s.welcomeSpec(st, l, hello.GetAppliedGeneration(), log); err != nil {
		return err
	}
	if n.Role == "site" {
		// Every site agent learns at once whether it holds the boot lease
		// (a spec change, queued behind the full spec; not from this
		// goroutine, which drains the queue from the loop below).
		go s.siteTouch(n.ID, n.Site)
	}

	recvErr := make(chan error, 1)
	go func() { recvErr <- s.receive(st, l, log) }()
	for {
		select {
		case f := <-l.out:
			if err := st.Send(f.f); err != nil {
				return err
			}
			if f.final {
				l.close()
				return nil
			}
		case err := <-recvErr:
			if err != nil && !errors.Is(err, context.Canceled) {
				log.Info("session ended", "err", err)
			} else {
				log.Info("session ended")
			}
			return nil
		case <-l.done:
			log.Info("session replaced or closed")
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// receive handles the agent's frames until the stream ends.
func (s *Server) receive(st *connect.BidiStream[bcdv1.AgentFrame, bcdv1.GatewayFrame], l *live, log interface {
	Info(string, ...any)
	Warn(string, ...any)
}) error {
	for {
		f, err := st.Receive()
		if err != nil {
			return err
		}
		switch x := f.Frame.(type) {
		case *bcdv1.AgentFrame_Heartbeat:
			s.heartbeat(l, x.Heartbeat, log)
		case *bcdv1.AgentFrame_Ack:
			for _, id := range x.Ack.GetCommandIds() {
				if err := s.store.MarkDelivered(l.nodeID, id); err != nil {
					log.Warn("ack for unknown command", "command_id", id)
				}
			}
		case *bcdv1.AgentFrame_Result:
			r := x.Result
			res := store.Result{
				Status: r.GetStatus(), Output: r.GetOutput(), Error: r.GetError(),
				StartedMS: r.GetStartedUnixMs(), FinishedMS: r.GetFinishedUnixMs(),
			}
			if len(r.GetAttestation()) > 0 {
				if c, err := s.store.Command(r.GetCommandId()); err == nil && c.NodeID == l.nodeID {
					if err := intent.VerifyResult(l.nodeKey, l.nodeID, c.Kind, r); err != nil {
						log.Warn("result attestation does not verify under the node's key", "command_id", r.GetCommandId(), "err", err)
					} else {
						res.Attestation = r.GetAttestation()
					}
				}
			}
			first, err := s.store.SetResult(l.nodeID, r.GetCommandId(), res)
			if errors.Is(err, store.ErrNotFound) {
				// Not ours (or long gone): ack it so the agent stops re-sending.
				log.Warn("result for an unknown command; acked and dropped", "command_id", r.GetCommandId())
			} else if err != nil {
				log.Warn("result refused", "command_id", r.GetCommandId(), "err", err)
				continue
			}
			if first {
				log.Info("command result", "command_id", r.GetCommandId(), "status", r.GetStatus())
				if c, err := s.store.Command(r.GetCommandId()); err == nil {
					s.bmcResult(c, r.GetStatus())
				}
				s.resultStored(r.GetCommandId())
			}
			l.push(outFrame{f: &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Ack{Ack: &bcdv1.Ack{ResultIds: []string{r.GetCommandId()}}}}})
		case *bcdv1.AgentFrame_Event:
			if err := s.storeEvent(l.nodeID, x.Event, log); err != nil {
				// Not acked, and the session ends: acking a later event
				// would drop this one on the agent (an ack covers every
				// seq up to its own). The agent sends it again after its
				// next Welcome.
				log.Warn("event not stored; ending the session", "seq", x.Event.GetSeq(), "err", err)
				return connectErr(connect.CodeUnavailable, "event %d not stored: %v", x.Event.GetSeq(), err)
			}
			l.push(outFrame{f: &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Ack{Ack: &bcdv1.Ack{EventSeq: x.Event.GetSeq()}}}})
		case *bcdv1.AgentFrame_Status:
			rep := x.Status
			if err := s.storeStatus(l.nodeID, rep); err != nil {
				log.Warn("status report refused", "err", err)
			}
			if v := rep.GetTrustVersion(); v > 0 {
				if err := s.noteTrustVersion(l.nodeID, v); err != nil {
					log.Warn("trust bundle acknowledgement not stored", "version", v, "err", err)
				} else {
					log.Info("trust bundle taken", "version", v)
				}
			}
			if rep.GetWantFullSpec() {
				s.resendFullSpec(l, rep, log)
			}
		case *bcdv1.AgentFrame_Progress:
			if err := s.storeProgress(l.nodeID, x.Progress); err != nil {
				log.Warn("progress refused", "command_id", x.Progress.GetCommandId(), "err", err)
			}
		case *bcdv1.AgentFrame_SecretRequest:
			req := x.SecretRequest
			go l.push(outFrame{f: s.answerSecret(l, req)})
		case *bcdv1.AgentFrame_WorkloadTokenRequest:
			req := x.WorkloadTokenRequest
			go l.push(outFrame{f: s.answerWorkloadToken(l, req)})
		case *bcdv1.AgentFrame_Hello:
			return connectErr(connect.CodeInvalidArgument, "Hello sent twice")
		default:
			// Frames later features handle (WorkloadTokenRequest...) are
			// accepted and ignored by the lab gateway for now.
		}
	}
}

// welcomeSpec sends a new session the node's desired spec in full when the
// agent holds another generation than the stored one (applied, from its
// Hello), then lets spec changes reach the session. It runs before the
// session's send loop, under the node's spec lock, so no change is lost or
// sent ahead of it.
func (s *Server) welcomeSpec(st *connect.BidiStream[bcdv1.AgentFrame, bcdv1.GatewayFrame], l *live, applied uint64, log interface {
	Info(string, ...any)
}) error {
	unlock := s.specLocks.lock(l.nodeID)
	defer unlock()
	f, gen, err := s.fullSpecFrame(l.nodeID)
	if err != nil {
		return connectErr(connect.CodeUnavailable, "store: %v", err)
	}
	if f != nil && gen != applied {
		if err := st.Send(f); err != nil {
			return err
		}
		l.fullGen.Store(gen)
		log.Info("desired spec sent in full", "generation", gen, "applied_generation", applied)
	}
	l.specReady.Store(true)
	return nil
}

// resendFullSpec answers a StatusReport asking for the full spec (the agent
// refused a DesiredState, or cannot apply a patch to what it holds) with
// the stored spec in full, unless the agent refused that very generation
// after this session sent it in full: sending it again would not help, and
// the next change (or session) sends it again.
func (s *Server) resendFullSpec(l *live, rep *bcdv1.StatusReport, log interface {
	Info(string, ...any)
	Warn(string, ...any)
}) {
	unlock := s.specLocks.lock(l.nodeID)
	defer unlock()
	f, gen, err := s.fullSpecFrame(l.nodeID)
	switch {
	case err != nil:
		log.Warn("full spec asked for, not sent", "err", err)
		return
	case f == nil:
		log.Info("full spec asked for; this node has no desired spec")
		return
	case rep.GetRefusedGeneration() == gen && l.fullGen.Load() == gen:
		log.Warn("the agent refused the full spec of this generation; not sent again until the spec changes",
			"generation", gen, "spec_error", rep.GetSpecError())
		return
	}
	l.fullGen.Store(gen)
	l.push(outFrame{f: f})
	log.Info("desired spec sent in full on request", "generation", gen, "refused_generation", rep.GetRefusedGeneration(), "spec_error", rep.GetSpecError())
}
