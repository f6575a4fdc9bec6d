package gateway

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// outFrame is a frame queued for a session; a final frame ends it once sent.
type outFrame struct {
	f     *bcdv1.GatewayFrame
	final bool
}

// live is one accepted session.
type live struct {
	nodeID string
	role   string
	site   string
	epoch  uint64
	out    chan outFrame
	done   chan struct{}
	once   sync.Once
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
	var wg sync.WaitGroup
	for _, l := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Drain{Drain: &bcdv1.Drain{Reason: reason, RedialAfterMs: 500}}}
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
		return st.Send(&bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Revocation{Revocation: &bcdv1.RevocationNotice{Reason: "revoked by an operator"}}})
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
	l := &live{nodeID: n.ID, role: n.Role, site: n.Site, epoch: epoch, out: make(chan outFrame, 64), done: make(chan struct{})}
	_, ok := s.hub.register(l)
	s.hub.release()
	reserved = false
	if !ok {
		return connectErr(connect.CodeUnavailable, "gateway is draining")
	}
	defer s.hub.unregister(l)
	defer l.close()
	log = log.With("epoch", epoch)
	log.Info("session accepted", "boot_id", hello.GetBootId(), "role", hello.GetRole(), "version", hello.GetVersion())

	if err := st.Send(&bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Welcome{Welcome: &bcdv1.Welcome{
		Epoch: epoch, ServerTimeUnixMs: s.now().UnixMilli(), HeartbeatSeconds: uint32(s.cfg.Heartbeat / time.Second),
		EventAck: hello.GetLastAckedEvent(),
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
	if n.Role == "site" {
		// Every site agent learns at once whether it holds the boot lease,
		// and what it should cache.
		s.siteTouch(n, l, true)
		s.siteWelcome(n, l)
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
			n, _ := s.store.UpdateNode(l.nodeID, func(n *store.Node) error { n.LastSeen = s.now().UTC(); return nil })
			if l.role == "site" {
				s.siteTouch(n, l, false)
			}
		case *bcdv1.AgentFrame_Ack:
			for _, id := range x.Ack.GetCommandIds() {
				if err := s.store.MarkDelivered(l.nodeID, id); err != nil {
					log.Warn("ack for unknown command", "command_id", id)
				}
			}
		case *bcdv1.AgentFrame_Result:
			r := x.Result
			first, err := s.store.SetResult(l.nodeID, r.GetCommandId(), store.Result{
				Status: r.GetStatus(), Output: r.GetOutput(), Error: r.GetError(),
				StartedMS: r.GetStartedUnixMs(), FinishedMS: r.GetFinishedUnixMs(),
			})
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
			l.push(outFrame{f: &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Ack{Ack: &bcdv1.Ack{EventSeq: x.Event.GetSeq()}}}})
		case *bcdv1.AgentFrame_Status:
			if err := s.storeStatus(l.nodeID, x.Status.GetSections()); err != nil {
				log.Warn("status report refused", "err", err)
			}
		case *bcdv1.AgentFrame_Progress:
			if err := s.storeProgress(l.nodeID, x.Progress); err != nil {
				log.Warn("progress refused", "command_id", x.Progress.GetCommandId(), "err", err)
			}
		case *bcdv1.AgentFrame_SecretRequest:
			req := x.SecretRequest
			go l.push(outFrame{f: s.answerSecret(l, req)})
		case *bcdv1.AgentFrame_Hello:
			return connectErr(connect.CodeInvalidArgument, "Hello sent twice")
		default:
			// Frames later features handle (StatusReport, SecretRequest...)
			// are accepted and ignored by the lab gateway for now.
		}
	}
}
