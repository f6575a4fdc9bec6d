package fleet

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/intent"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Several gateways on one store (PostgreSQL). Each holds the sessions of
// the agents that dialled it; what one gateway must tell the gateway
// holding a node's session travels as a store.Notice (LISTEN/NOTIFY):
//
//   - a command stored through any gateway's admin API: the holder sends
//     it (the notice is sent in AddCommand's transaction);
//   - a result stored (SetResult's first copy) or a command cancelled
//     before delivery: every gateway wakes its admin calls waiting for it;
//   - a delivered command cancelled: the holder sends the signed Cancel;
//   - a session accepted (its epoch): an older session of that node on
//     another gateway ends, so a node has one session across the fleet;
//   - a revocation: the holder tells the agent and ends its session;
//   - a desired spec changed where the node has no session: the holder
//     sends it in full;
//   - the trust bundle changed: the others load it from the store and
//     drain their sessions, as the changing gateway does.
//
// A notice only says where to look; the store stays the truth. A notice
// lost (the listener's connection dropped) is made up for by the sweep:
// every sharedSweep, and at once after the listener reconnects, the trust
// bundle and the command-signing key are read again (rotate.go), commands
// still unacked are sent again to the sessions held here, and every
// waiter reads its command again. After a reconnect, catchUp also reads
// the trust bundle again and each held node's revocation and spec. An agent takes a command it already
// holds as the same command (its journal keys on the id), so a second
// copy runs nothing twice.

// sharedSweep is the safety net's period: far slower than the notices,
// which do the work.
var sharedSweep = 5 * time.Second

// pushCommand sends a stored command to the node's session. On a shared
// store the command's notice does it, on whichever gateway holds the
// session (this one included).
func (s *Fleet) pushCommand(c store.Command) {
	if s.shared == nil {
		s.hub.Send(c.NodeID, CommandFrame(c))
	}
}

// Notify sends a notice to every gateway, logging a failure (the sweep
// and the next session's replay make up for it).
func (s *Fleet) Notify(n store.Notice) {
	if err := s.shared.Notify(n); err != nil {
		s.NoticeUnsent(n, err)
	}
}

// NoticeUnsent counts and logs a notice that did not reach the other
// gateways: one of the fleet's, or one the store sends after the writes
// it tells of (pgstore.OnNoticeUnsent).
func (s *Fleet) NoticeUnsent(n store.Notice, err error) {
	s.cfg.Metrics.NoticeUnsent()
	s.log.Warn("notice not sent to the other gateways", "kind", n.Kind, "node", n.Node, "command_id", n.Command, "err", err)
}

// sharedLoop listens for notices until ctx ends, listening again after a
// lost connection (1 s, doubling to 30 s), and runs the sweep.
func (s *Fleet) sharedLoop(ctx context.Context) {
	go every(ctx, sharedSweep, s.sweep)
	wait := time.Second
	for ctx.Err() == nil {
		start := time.Now()
		err := s.shared.Listen(ctx, s.onNotice, func() {
			s.log.Info("listening for the other gateways' notices")
			s.catchingUp.Store(true)
			go s.sweep()
			go func() {
				defer s.catchingUp.Store(false)
				s.catchUp()
			}()
			s.wakeAll()
		})
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			wait = time.Second
		}
		s.cfg.Metrics.NoticeListenerLost()
		s.log.Warn("notices from the other gateways lost; listening again", "err", err, "retry_in", wait.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// sweep sends the commands still unacked (and older than a second, so
// not those whose notice is on its way) to the sessions held here.
func (s *Fleet) sweep() {
	// First the trust bundle and the command-signing key (a notice of
	// their change may be lost, or never sent by a gateway that stopped
	// in a rotation): a session welcomed with an older bundle is drained
	// before commands are sent again. Not while catchUp runs: it sends
	// the revocations it finds before that drain, which would end their
	// sessions first, and reloads the bundle itself.
	if !s.catchingUp.Load() {
		s.reloadTrust()
	}
	s.pruneProgress()
	for _, f := range s.onSweep {
		f()
	}
	var held []string
	for _, l := range s.hub.All() {
		held = append(held, l.NodeID)
	}
	cs, err := s.shared.Pending(held, 10000)
	if err != nil {
		s.log.Warn("pending commands not read", "err", err)
		return
	}
	old := s.now().Add(-time.Second)
	again := 0
	for _, c := range cs {
		if c.CreatedAt.Before(old) {
			s.hub.Send(c.NodeID, CommandFrame(c))
			again++
		}
	}
	s.cfg.Metrics.NoticeMadeUp("command", again)
}

// wakeAll wakes every admin call waiting for a result, which reads its
// command again (results whose notices were lost).
func (s *Fleet) wakeAll() {
	s.mu.Lock()
	w := s.waiters
	s.waiters = nil
	s.mu.Unlock()
	for _, cs := range w {
		for _, c := range cs {
			close(c)
		}
	}
}

// wake wakes the admin calls waiting for command id.
func (s *Fleet) wake(id string) {
	s.dropProgress(id)
	s.mu.Lock()
	w := s.waiters[id]
	delete(s.waiters, id)
	s.mu.Unlock()
	for _, c := range w {
		close(c)
	}
}

// onNotice acts on one notice. It runs on the listener's goroutine: what
// may wait on a session runs on its own.
func (s *Fleet) onNotice(n store.Notice) {
	switch n.Kind {
	case store.NoticeResult:
		s.wake(n.Command)
		s.dropProgress(n.Command)
	case store.NoticeProgress:
		s.progressNotice(n)
	case store.NoticeCommand:
		if s.hub.Get(n.Node) == nil {
			return
		}
		go func() {
			c, err := s.store.Command(n.Command)
			if err != nil {
				s.log.Warn("noticed command not read", "node", n.Node, "command_id", n.Command, "err", err)
				return
			}
			if c.NodeID == n.Node && c.State == store.StatePending {
				s.hub.Send(c.NodeID, CommandFrame(c))
			}
		}()
	case store.NoticeCancel:
		if s.hub.Get(n.Node) == nil {
			return
		}
		cf := &bcdv1.Cancel{CommandId: n.Command, Reason: n.Reason}
		if s.commandKey() != nil {
			var err error
			if cf.Signature, err = intent.SignCancel(s.commandKey(), n.Node, cf); err != nil {
				s.log.Warn("cancel not signed", "command_id", n.Command, "err", err)
				return
			}
		}
		s.hub.Send(n.Node, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Cancel{Cancel: cf}})
	case store.NoticeSession:
		// The node's newer session is on another gateway (or this one,
		// which registered it already): an older one here has lost.
		if l := s.hub.Get(n.Node); l != nil && l.Epoch < n.Epoch {
			s.log.Info("session moved to another gateway; ending it here", "node", n.Node, "epoch", l.Epoch, "new_epoch", n.Epoch)
			l.Close()
		}
	case store.NoticeRevoke:
		go s.hub.SendFinal(n.Node, RevocationFrame())
	case store.NoticeTrust:
		go s.reloadTrust()
	case store.NoticeSpec:
		l := s.hub.Get(n.Node)
		if l == nil {
			return
		}
		go func() {
			unlock := s.specLocks.lock(n.Node)
			defer unlock()
			if !l.SpecReady.Load() {
				return // its Welcome sends the spec in full
			}
			f, gen, err := s.FullSpecFrame(n.Node)
			if err != nil || f == nil {
				return
			}
			l.FullGen.Store(gen)
			l.Push(hub.Frame{F: f})
		}()
	}
}

// catchUp makes up for the notices other than commands' and results'
// (which the sweep covers) that were lost while the listener was away:
// the trust bundle is read again, and each session held here gets its
// node's revocation, or a spec changed meanwhile through another gateway
// that neither this session was sent nor the agent said it holds.
func (s *Fleet) catchUp() {
	defer s.reloadTrust() // last: a changed bundle drains the sessions
	for _, l := range s.hub.All() {
		n, err := s.store.Node(l.NodeID)
		if err != nil {
			continue
		}
		if n.Revoked {
			// Before the trust bundle's drain (deferred), which would end
			// the session first.
			s.hub.SendFinal(n.ID, RevocationFrame())
			continue
		}
		sp, err := s.store.Spec(n.ID)
		if err == nil && sp.Generation > n.AppliedGeneration && sp.Generation > l.FullGen.Load() {
			s.cfg.Metrics.NoticeMadeUp("spec", 1)
			s.onNotice(store.Notice{Kind: store.NoticeSpec, Node: n.ID})
		}
	}
}

// RevocationFrame tells an agent its certificate was revoked; its session
// ends after it.
func RevocationFrame() *bcdv1.GatewayFrame {
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Revocation{Revocation: &bcdv1.RevocationNotice{Reason: "revoked by an operator"}}}
}

// errNotOurs stops a store update that finds the node's session is no
// longer the one this gateway ended.
var errNotOurs = errors.New("the node's session moved on")

// SessionEnded clears the node's Gateway when the session that ended is
// still its latest (the same epoch, held here): a node whose agent
// reconnected elsewhere in the meantime keeps the other gateway's name.
func (s *Fleet) SessionEnded(nodeID string, epoch uint64, log *slog.Logger) {
	_, err := s.store.UpdateNode(nodeID, func(x *store.Node) error {
		if x.Epoch != epoch || x.Gateway != s.cfg.Name {
			return errNotOurs
		}
		x.Gateway = ""
		return nil
	})
	if err != nil && !errors.Is(err, errNotOurs) {
		// A gateway stopping may have closed its store: the node's next
		// session writes Gateway again.
		log.Debug("session's end not stored", "err", err)
	}
}

// SessionOn says which gateway holds the node's session: this one when
// its hub holds it; on a shared store, the one the node's record names,
// while the record was refreshed recently enough for that gateway to be
// alive (heartbeats write it at least every hub.SeenRefresh). A gateway that
// died leaves its name until then, or until the node's next session.
func (s *Fleet) SessionOn(n store.Node) (gateway string, connected bool) {
	if s.hub.Connected(n.ID) {
		return s.cfg.Name, true
	}
	if s.shared == nil || n.Gateway == "" || n.Gateway == s.cfg.Name {
		return "", false
	}
	if s.now().Sub(n.LastSeen) > hub.SeenRefresh+2*s.cfg.Heartbeat {
		return "", false
	}
	return n.Gateway, true
}
