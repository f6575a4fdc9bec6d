package agentsvc

import (
	"context"
	"crypto/x509"
	"errors"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/intent"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// busy refuses a session with a retry pushback the agent honours.
func (s *Service) busy(why string) error {
	err := connect.NewError(connect.CodeResourceExhausted, errors.New(why))
	err.Meta().Set("grpc-retry-pushback-ms", strconv.FormatInt(s.cfg.Pushback.Milliseconds(), 10))
	return err
}

// frameStream is one agent's stream of frames: the Session RPC over
// HTTP/2, or the WebSocket fallback (websocket.go).
type frameStream interface {
	Send(*bcdv1.GatewayFrame) error
	Receive() (*bcdv1.AgentFrame, error)
}

// Session serves one agent's stream.
func (s *Service) Session(ctx context.Context, st *connect.BidiStream[bcdv1.AgentFrame, bcdv1.GatewayFrame]) error {
	release, ok := s.setups.enter(ctx)
	defer release()
	if !ok {
		return s.setupBusy()
	}
	n, cert, err := s.peerNode(ctx)
	if err != nil {
		return err
	}
	return s.serve(ctx, n, cert, st, false, release)
}

// setupBusy refuses a session that waited too long for a set-up slot
// (setup.go), with the busy pushback.
func (s *Service) setupBusy() error {
	s.Metrics().SessionRefused("setup_queue")
	return s.busy("gateway is setting up other sessions; retry later")
}

// serve runs the session of node n, whose certificate cert the agent
// proved it holds (mTLS, or the fallback's node proof); overWS marks a
// session on the WebSocket fallback, which carries no tunnels. It calls
// setupDone once the session's set-up is over (its set-up slot, setup.go).
func (s *Service) serve(ctx context.Context, n store.Node, cert *x509.Certificate, st frameStream, overWS bool, setupDone func()) error {
	log := s.log.With("node", n.ID, "rpc", "Session")
	if overWS {
		log = log.With("transport", "websocket")
	}
	if n.Revoked {
		s.Metrics().SessionRefused("revoked")
		log.Info("session refused", "reason", "revoked")
		return st.Send(fleet.RevocationFrame())
	}
	serial := cert.SerialNumber.Text(16)
	if !n.Current(serial) {
		return connectErr(connect.CodeUnauthenticated, "certificate was superseded by a renewal")
	}
	if !s.hub.Reserve(n.ID, s.cfg.MaxSessions) {
		s.Metrics().SessionRefused("busy")
		log.Warn("session refused", "reason", "busy", "sessions", s.hub.Count())
		return s.busy("gateway is at its session limit; retry later")
	}
	reserved := true
	defer func() {
		if reserved {
			s.hub.Release()
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
	if s.hub.Draining() {
		s.Metrics().SessionRefused("draining")
		return connectErr(connect.CodeUnavailable, "gateway is draining")
	}
	// The epoch, the session's record and the notice to the other
	// gateways (an older session of this node left on one of them,
	// half-open, its agent gone, ends there): one transaction.
	now := s.now().UTC()
	stored, err := s.store.StartSession(n.ID, func(x *store.Node) error {
		x.LastSeen = now
		x.AppliedGeneration, x.ObservedGeneration = hello.GetAppliedGeneration(), hello.GetObservedGeneration()
		x.TrustVersion, x.TrustVersionAt = hello.GetTrustBundleVersion(), now
		x.Version = hello.GetVersion()
		x.Gateway = s.cfg.Name
		if x.CertSerial == serial {
			// The renewed certificate is in use: the one before it is done.
			x.PrevCertSerial = ""
		}
		return nil
	})
	if err != nil {
		return connectErr(connect.CodeUnavailable, "store: %v", err)
	}
	epoch := stored.Epoch
	if s.shared != nil {
		defer s.SessionEnded(n.ID, epoch, log.With("epoch", epoch))
	}
	l := hub.NewLive(cert.PublicKey, n.ID, n.Role, n.Site, epoch)
	l.WebSocket = overWS
	_, ok := s.hub.Register(l)
	s.hub.Release()
	reserved = false
	if !ok {
		return connectErr(connect.CodeUnavailable, "gateway is draining")
	}
	defer s.hub.Unregister(l)
	defer l.Close()
	log = log.With("epoch", epoch)
	log.Info("session accepted", "boot_id", hello.GetBootId(), "role", hello.GetRole(), "version", hello.GetVersion(),
		"applied_generation", hello.GetAppliedGeneration(), "observed_generation", hello.GetObservedGeneration(),
		"trust_bundle_version", hello.GetTrustBundleVersion())
	l.Beat.HelloStored(now, hello.GetAppliedGeneration(), hello.GetObservedGeneration(), stored.InventoryHashes)
	if err := s.welcome(st, l, hello, log); err != nil {
		return err
	}
	setupDone()
	if n.Role == "site" {
		// Every site agent learns at once whether it holds the boot lease
		// (a spec change, queued behind the full spec; not from this
		// goroutine, which drains the queue from the loop below).
		go s.SiteTouch(n.ID, n.Site)
	}

	recvErr := make(chan error, 1)
	go func() { recvErr <- s.receive(st, l, log) }()
	for {
		select {
		case f := <-l.Out():
			if err := st.Send(f.F); err != nil {
				return err
			}
			if c := f.F.GetCommand(); c != nil {
				s.Metrics().CommandSent(c.GetId(), s.now())
			}
			if f.Final {
				l.Close()
				return nil
			}
		case err := <-recvErr:
			if err != nil && !errors.Is(err, context.Canceled) {
				log.Info("session ended", "err", err)
			} else {
				log.Info("session ended")
			}
			return nil
		case <-l.Done():
			log.Info("session replaced or closed")
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// receive handles the agent's frames until the stream ends.
func (s *Service) receive(st frameStream, l *hub.Live, log interface {
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
				if err := s.store.MarkDelivered(l.NodeID, id); err != nil {
					log.Warn("ack for unknown command", "command_id", id)
				}
			}
		case *bcdv1.AgentFrame_Result:
			r := x.Result
			first, err := s.storeResult(l, r, log)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				// Not acked, and tried again while the session lasts: the
				// agent sends an unacked result once per session, so giving
				// up here would leave it unstored until the node's next
				// session. The session goes on: result acks are per command
				// (an event's ack covers every seq below it).
				log.Warn("result refused; storing it again until the store takes it", "command_id", r.GetCommandId(), "err", err)
				go s.retryResult(l, r, log)
				continue
			}
			s.resultTaken(l, r, first, err, log)
		case *bcdv1.AgentFrame_Event:
			if err := s.StoreEvent(l.NodeID, x.Event, log); err != nil {
				// Not acked, and the session ends: acking a later event
				// would drop this one on the agent (an ack covers every
				// seq up to its own). The agent sends it again after its
				// next Welcome.
				log.Warn("event not stored; ending the session", "seq", x.Event.GetSeq(), "err", err)
				return connectErr(connect.CodeUnavailable, "event %d not stored: %v", x.Event.GetSeq(), err)
			}
			l.Push(hub.Frame{F: &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Ack{Ack: &bcdv1.Ack{EventSeq: x.Event.GetSeq()}}}})
		case *bcdv1.AgentFrame_Status:
			rep := x.Status
			// The first report after Welcome is compared with what the
			// set-up read; later ones with the record read again.
			_, err := s.StoreStatus(l.NodeID, rep, l.SetupReport, l.SetupReportRead)
			l.SetupReport, l.SetupReportRead = nil, false
			if err != nil {
				log.Warn("status report refused", "err", err)
			}
			if v := rep.GetTrustVersion(); v > 0 {
				if err := s.NoteTrustVersion(l.NodeID, v); err != nil {
					log.Warn("trust bundle acknowledgement not stored", "version", v, "err", err)
				} else {
					log.Info("trust bundle taken", "version", v)
				}
			}
			if rep.GetWantFullSpec() {
				s.resendFullSpec(l, rep, log)
			}
		case *bcdv1.AgentFrame_Progress:
			if err := s.StoreProgress(l.NodeID, x.Progress); err != nil {
				log.Warn("progress refused", "command_id", x.Progress.GetCommandId(), "err", err)
			}
		case *bcdv1.AgentFrame_SecretRequest:
			req := x.SecretRequest
			go l.Push(hub.Frame{F: s.AnswerSecret(l, req)})
		case *bcdv1.AgentFrame_WorkloadTokenRequest:
			req := x.WorkloadTokenRequest
			go l.Push(hub.Frame{F: s.answerWorkloadToken(l, req)})
		case *bcdv1.AgentFrame_Hello:
			return connectErr(connect.CodeInvalidArgument, "Hello sent twice")
		default:
			// Frames later features handle (WorkloadTokenRequest...) are
			// accepted and ignored by the lab gateway for now.
		}
	}
}

// welcome sends a new session, registered, what it starts with: the
// Welcome, every unfinished command of the node, and its desired spec in
// full when the agent holds another generation than the stored one
// (applied, from its Hello). All three come from one store read, made
// after the session registered (a command stored since reaches it through
// the hub; the agent takes a copy of one it holds as the same command)
// and under the node's spec lock, so no spec change is lost or sent ahead
// of the full spec; spec changes reach the session from then on.
func (s *Service) welcome(st frameStream, l *hub.Live, hello *bcdv1.Hello, log interface {
	Info(string, ...any)
}) error {
	unlock := s.LockSpec(l.NodeID)
	defer unlock()
	state, err := s.store.SessionState(l.NodeID)
	if err != nil {
		return connectErr(connect.CodeUnavailable, "store: %v", err)
	}
	l.SetupReport, l.SetupReportRead = state.Report, true
	if err := st.Send(&bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Welcome{Welcome: &bcdv1.Welcome{
		Epoch: l.Epoch, ServerTimeUnixMs: s.now().UnixMilli(), HeartbeatSeconds: uint32(s.cfg.Heartbeat / time.Second),
		EventAck: hello.GetLastAckedEvent(), RequestedSections: fleet.MissingInventory(state.Report),
		// Read after the session registered: a bundle changed since is
		// either in this Welcome or followed by a Drain (changeTrust).
		TrustBundle: s.TrustBundle(),
	}}}); err != nil {
		return err
	}
	for _, c := range state.Unfinished {
		if err := st.Send(fleet.CommandFrame(c)); err != nil {
			return err
		}
		s.Metrics().CommandSent(c.ID, s.now())
	}
	f, gen, err := s.SpecFrame(l.NodeID, state.Spec)
	if err != nil {
		return connectErr(connect.CodeUnavailable, "store: %v", err)
	}
	if applied := hello.GetAppliedGeneration(); f != nil && gen != applied {
		if err := st.Send(f); err != nil {
			return err
		}
		l.FullGen.Store(gen)
		log.Info("desired spec sent in full", "generation", gen, "applied_generation", applied)
	}
	l.SpecReady.Store(true)
	return nil
}

// resendFullSpec answers a StatusReport asking for the full spec (the agent
// refused a DesiredState, or cannot apply a patch to what it holds) with
// the stored spec in full, unless the agent refused that very generation
// after this session sent it in full: sending it again would not help, and
// the next change (or session) sends it again.
func (s *Service) resendFullSpec(l *hub.Live, rep *bcdv1.StatusReport, log interface {
	Info(string, ...any)
	Warn(string, ...any)
}) {
	unlock := s.LockSpec(l.NodeID)
	defer unlock()
	f, gen, err := s.FullSpecFrame(l.NodeID)
	switch {
	case err != nil:
		log.Warn("full spec asked for, not sent", "err", err)
		return
	case f == nil:
		log.Info("full spec asked for; this node has no desired spec")
		return
	case rep.GetRefusedGeneration() == gen && l.FullGen.Load() == gen:
		log.Warn("the agent refused the full spec of this generation; not sent again until the spec changes",
			"generation", gen, "spec_error", rep.GetSpecError())
		return
	}
	l.FullGen.Store(gen)
	l.Push(hub.Frame{F: f})
	log.Info("desired spec sent in full on request", "generation", gen, "refused_generation", rep.GetRefusedGeneration(), "spec_error", rep.GetSpecError())
}

// storeResult stores a command's result with its attestation when that
// verifies under the node's key; first is true for the first copy stored.
func (s *Service) storeResult(l *hub.Live, r *bcdv1.CommandResult, log interface{ Warn(string, ...any) }) (first bool, err error) {
	res := store.Result{
		Status: r.GetStatus(), Output: r.GetOutput(), Error: r.GetError(),
		StartedMS: r.GetStartedUnixMs(), FinishedMS: r.GetFinishedUnixMs(),
	}
	if len(r.GetAttestation()) > 0 {
		c, err := s.store.Command(r.GetCommandId())
		switch {
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return false, err
		case err == nil && c.NodeID == l.NodeID:
			if err := intent.VerifyResult(l.NodeKey, l.NodeID, c.Kind, r); err != nil {
				log.Warn("result attestation does not verify under the node's key", "command_id", r.GetCommandId(), "err", err)
			} else {
				res.Attestation = r.GetAttestation()
			}
		}
	}
	return s.store.SetResult(l.NodeID, r.GetCommandId(), res)
}

// resultTaken acks a result the store took (err nil) or has no command
// for (ErrNotFound: not ours, or long gone, acked so the agent stops
// sending it), and wakes those waiting for a first copy.
func (s *Service) resultTaken(l *hub.Live, r *bcdv1.CommandResult, first bool, err error, log interface {
	Info(string, ...any)
	Warn(string, ...any)
}) {
	if errors.Is(err, store.ErrNotFound) {
		log.Warn("result for an unknown command; acked and dropped", "command_id", r.GetCommandId())
	}
	if first {
		s.Metrics().CommandResult(r.GetCommandId(), s.now())
		log.Info("command result", "command_id", r.GetCommandId(), "status", r.GetStatus())
		if c, err := s.store.Command(r.GetCommandId()); err == nil {
			s.BMCResult(c, r.GetStatus())
		}
		s.ResultStored(r.GetCommandId())
	}
	l.Push(hub.Frame{F: &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Ack{Ack: &bcdv1.Ack{ResultIds: []string{r.GetCommandId()}}}}})
}

// Back-off of a result the store refused: from resultRetryFirst, doubling
// to resultRetryMax, so a result is stored at most resultRetryMax after
// the database is back.
var (
	resultRetryFirst = 250 * time.Millisecond
	resultRetryMax   = 2 * time.Second
)

// retryResult stores a refused result again, with back-off, until the
// store takes it (then acks it) or the session ends (the agent sends it
// again on its next session).
func (s *Service) retryResult(l *hub.Live, r *bcdv1.CommandResult, log interface {
	Info(string, ...any)
	Warn(string, ...any)
}) {
	s.Metrics().ResultRetrying(1)
	defer s.Metrics().ResultRetrying(-1)
	wait := resultRetryFirst
	for tries := 1; ; tries++ {
		select {
		case <-l.Done():
			log.Info("result still unstored when the session ended; the agent sends it again", "command_id", r.GetCommandId(), "tries", tries)
			return
		case <-time.After(wait):
		}
		first, err := s.storeResult(l, r, log)
		if err == nil || errors.Is(err, store.ErrNotFound) {
			log.Info("result stored after a refusal", "command_id", r.GetCommandId(), "tries", tries+1)
			s.resultTaken(l, r, first, err, log)
			return
		}
		wait = min(2*wait, resultRetryMax)
	}
}
