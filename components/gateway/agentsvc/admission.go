package agentsvc

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Handshake admission: when thousands of agents dial at once (a fleet
// powered on together, or every agent of a gateway that restarted), each
// TLS handshake costs the gateway an ECDSA signature and a certificate
// chain check. Started all at once on two cores, every handshake makes
// slow progress and most outlive the agent's 10 s handshake timeout: the
// agents redial and the gateway did the work for nothing. So the gateway
// runs at most a few handshakes at a time; a connection waits for its
// turn in arrival order, and one that waited longer than the agent would
// (handshakeQueueMax) is closed unanswered, costing nothing, and its agent
// redials after its back-off.

// handshakeQueueMax is how long an accepted connection may wait for its
// handshake to start: agents give a handshake 10 s in all.
const handshakeQueueMax = 5 * time.Second

// handshakeTimeout bounds one handshake once started.
const handshakeTimeout = 10 * time.Second

// handshakeListener accepts TCP connections and returns them from Accept
// only once their TLS handshake completed, at most slots handshakes at a
// time.
type handshakeListener struct {
	inner    net.Listener
	cfg      *tls.Config
	slots    chan struct{}
	maxWait  time.Duration
	timeout  time.Duration
	ready    chan net.Conn
	errc     chan error
	closed   chan struct{}
	once     sync.Once
	log      *slog.Logger
	refusedN func() // counts a connection closed for waiting too long
}

// HandshakeSlots is how many handshakes run at once. A handshake holds
// its slot while it waits for the agent's next flight too, so there are
// more than cores: 32 per core keep the cores busy when agents answer
// slowly, and are still far from thousands at once.
func HandshakeSlots() int { return 32 * runtime.GOMAXPROCS(0) }

// NewHandshakeListener admits inner's connections to their handshakes;
// refused, when not nil, is called for each connection closed unanswered
// after waiting handshakeQueueMax (bcgw counts them).
func NewHandshakeListener(inner net.Listener, cfg *tls.Config, slots int, log *slog.Logger, refused func()) *handshakeListener {
	h := &handshakeListener{inner: inner, cfg: cfg, slots: make(chan struct{}, slots), maxWait: handshakeQueueMax,
		timeout: handshakeTimeout, ready: make(chan net.Conn), errc: make(chan error, 1), closed: make(chan struct{}), log: log,
		refusedN: refused}
	go h.acceptLoop()
	return h
}

func (h *handshakeListener) acceptLoop() {
	for {
		c, err := h.inner.Accept()
		if err != nil {
			select {
			case <-h.closed:
				return
			default:
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of file descriptors: the connection waits in the
				// kernel's backlog until a session ends.
				h.log.Warn("accept: out of file descriptors; raise the open-file limit (LimitNOFILE=)", "err", err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			h.errc <- err
			return
		}
		go h.handshake(c, time.Now())
	}
}

func (h *handshakeListener) handshake(c net.Conn, arrived time.Time) {
	wait := time.NewTimer(h.maxWait - time.Since(arrived))
	select {
	case h.slots <- struct{}{}:
		wait.Stop()
	case <-wait.C:
		if h.refusedN != nil {
			h.refusedN()
		}
		c.Close()
		return
	case <-h.closed:
		wait.Stop()
		c.Close()
		return
	}
	tc := tls.Server(c, h.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	<-h.slots
	if err != nil {
		h.log.Debug("TLS handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	select {
	case h.ready <- tc:
	case <-h.closed:
		tc.Close()
	}
}

// Accept returns the next connection whose handshake completed.
func (h *handshakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.ready:
		return c, nil
	case err := <-h.errc:
		return nil, err
	case <-h.closed:
		return nil, net.ErrClosed
	}
}

func (h *handshakeListener) Close() error {
	h.once.Do(func() { close(h.closed) })
	return h.inner.Close()
}

func (h *handshakeListener) Addr() net.Addr { return h.inner.Addr() }
