package hub

import (
	"crypto"
	"sync"
	"sync/atomic"
	"time"

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Frame is a frame queued for a session; a final frame ends it once sent.
type Frame struct {
	F     *bcdv1.GatewayFrame
	Final bool
}

// Live is one accepted session.
type Live struct {
	// NodeKey is the public key of the certificate the session runs
	// under: the node key that attests results.
	NodeKey crypto.PublicKey
	NodeID  string
	Role    string
	Site    string
	Epoch   uint64
	out     chan Frame
	done    chan struct{}
	once    sync.Once
	// sendMu guards sends and sending: the frames Hub.Send queued and
	// whether a goroutine is pushing them, in the order they were sent.
	sendMu  sync.Mutex
	sends   []Frame
	sending bool
	// SpecReady is set once the session sent what its Hello asked of the
	// desired spec; spec changes are pushed to it only from then on (before,
	// the full spec it gets covers them).
	SpecReady atomic.Bool
	// FullGen is the generation of the last full spec sent on this session.
	FullGen atomic.Uint64
	// Beat is what this session last wrote of its heartbeats.
	Beat Beat
	// WebSocket marks a session on the WebSocket fallback, which carries
	// no tunnels.
	WebSocket bool
	// SetupReport is the node's status report record as the session's
	// set-up read it, until the first report on the session is compared
	// with it (the agent sends its latest report after each Welcome);
	// SetupReportRead says it was read. Only the session's receiving
	// goroutine uses them once the session runs.
	SetupReport     []byte
	SetupReportRead bool
}

// NewLive makes the session of node nodeID, whose certificate's key is
// nodeKey, in epoch.
func NewLive(nodeKey crypto.PublicKey, nodeID, role, site string, epoch uint64) *Live {
	return &Live{NodeKey: nodeKey, NodeID: nodeID, Role: role, Site: site, Epoch: epoch, out: make(chan Frame, 64), done: make(chan struct{})}
}

// Out is the queue the session's send loop writes.
func (l *Live) Out() <-chan Frame { return l.out }

// Done is closed when the session ends or is replaced.
func (l *Live) Done() <-chan struct{} { return l.done }

// Close ends the session.
func (l *Live) Close() { l.once.Do(func() { close(l.done) }) }

// Push queues a frame unless the session has ended.
func (l *Live) Push(f Frame) {
	select {
	case l.out <- f:
	case <-l.done:
	}
}

// Hub tracks the live session of each node.
type Hub struct {
	mu       sync.Mutex
	sessions map[string]*Live
	reserved int // sessions past the limit check, not yet registered
	draining bool
}

// Reserve holds a place for a session under the limit (0: none) until
// release; a node that already has a session may always replace it.
func (h *Hub) Reserve(nodeID string, limit int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if limit > 0 && h.sessions[nodeID] == nil && len(h.sessions)+h.reserved >= limit {
		return false
	}
	h.reserved++
	return true
}

// Release gives back a place Reserve held.
func (h *Hub) Release() {
	h.mu.Lock()
	h.reserved--
	h.mu.Unlock()
}

// New returns an empty hub.
func New() *Hub { return &Hub{sessions: map[string]*Live{}} }

// Register makes l the node's session, ending any older one.
func (h *Hub) Register(l *Live) (count int, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining {
		return 0, false
	}
	if old := h.sessions[l.NodeID]; old != nil {
		old.Close()
	}
	h.sessions[l.NodeID] = l
	return len(h.sessions), true
}

// Unregister removes l unless a newer session replaced it.
func (h *Hub) Unregister(l *Live) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions[l.NodeID] == l {
		delete(h.sessions, l.NodeID)
	}
}

// Draining reports whether DrainAll ran: new sessions are refused.
func (h *Hub) Draining() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.draining
}

// All returns the live sessions.
func (h *Hub) All() []*Live {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Live, 0, len(h.sessions))
	for _, l := range h.sessions {
		out = append(out, l)
	}
	return out
}

// Count is the number of live sessions.
func (h *Hub) Count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

// Get returns the node's live session, or nil.
func (h *Hub) Get(nodeID string) *Live {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sessions[nodeID]
}

// Connected reports whether the node has a live session here.
func (h *Hub) Connected(nodeID string) bool { return h.Get(nodeID) != nil }

// Send queues f on the node's live session, if any, without waiting.
// Frames sent to one session go out in the order they were given (a
// batch's commands in the batch's order): one goroutine per session pushes
// them while there are any.
func (h *Hub) Send(nodeID string, f *bcdv1.GatewayFrame) {
	if l := h.Get(nodeID); l != nil {
		l.sendLater(Frame{F: f})
	}
}

// sendLater queues f behind the frames sendLater queued before it and
// starts their pusher if none runs.
func (l *Live) sendLater(f Frame) {
	l.sendMu.Lock()
	l.sends = append(l.sends, f)
	start := !l.sending
	l.sending = true
	l.sendMu.Unlock()
	if start {
		go l.pushSends()
	}
}

// pushSends pushes the queued frames in order until none is left (or the
// session ended: Push then returns at once).
func (l *Live) pushSends() {
	for {
		l.sendMu.Lock()
		if len(l.sends) == 0 {
			l.sending = false
			l.sendMu.Unlock()
			return
		}
		f := l.sends[0]
		l.sends[0] = Frame{}
		l.sends = l.sends[1:]
		l.sendMu.Unlock()
		l.Push(f)
	}
}

// SendFinal queues f on the node's live session, if any, to end it once
// sent; it waits until f is queued or the session ended.
func (h *Hub) SendFinal(nodeID string, f *bcdv1.GatewayFrame) {
	if l := h.Get(nodeID); l != nil {
		l.Push(Frame{F: f, Final: true})
	}
}

// DrainAll sends Drain to every session and refuses new ones.
func (h *Hub) DrainAll(reason string) int {
	h.mu.Lock()
	h.draining = true
	all := make([]*Live, 0, len(h.sessions))
	for _, l := range h.sessions {
		all = append(all, l)
	}
	h.mu.Unlock()
	return drain(all, reason, 500*time.Millisecond)
}

// DrainLive sends Drain to every live session (each agent redials after
// redial plus its jitter) and goes on accepting new ones.
func (h *Hub) DrainLive(reason string, redial time.Duration) int {
	return drain(h.All(), reason, redial)
}

// drain queues a final Drain on each session and waits (up to 2 s) until
// each is sent or the session ended.
func drain(all []*Live, reason string, redial time.Duration) int {
	var wg sync.WaitGroup
	for _, l := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Drain{Drain: &bcdv1.Drain{Reason: reason, RedialAfterMs: uint32(redial.Milliseconds())}}}
			select {
			case l.out <- Frame{F: f, Final: true}:
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
