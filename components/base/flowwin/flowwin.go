// Package flowwin is a tunnel's flow-control window: a sender may have at
// most Size bytes its peer has not acknowledged, and the peer acknowledges
// bytes once it handed them on (TunnelData.ack, cumulative). A reader that
// stops reading thus stops the sender after Size bytes, on every hop,
// whatever the transport below buffers. Both the agent and bcgw use it.
package flowwin

import (
	"context"
	"sync"
)

// Size is the window; AckEvery is how many consumed bytes make an ack.
const (
	Size     = 512 << 10
	AckEvery = 128 << 10
)

// Window is the sending side's view.
type Window struct {
	mu     sync.Mutex
	sent   uint64
	acked  uint64
	closed bool
	wake   chan struct{}
}

// New returns an empty window.
func New() *Window { return &Window{wake: make(chan struct{})} }

// Take waits until n more bytes fit the window and counts them as sent.
// It fails when ctx ends or the window is closed.
func (w *Window) Take(ctx context.Context, n int) error {
	for {
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return context.Canceled
		}
		if w.sent+uint64(n)-w.acked <= Size || w.sent == w.acked {
			w.sent += uint64(n)
			w.mu.Unlock()
			return nil
		}
		wake := w.wake
		w.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Ack records the peer's cumulative acknowledgement (a stale or
// impossible one is ignored).
func (w *Window) Ack(total uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if total <= w.acked || total > w.sent {
		return
	}
	w.acked = total
	close(w.wake)
	w.wake = make(chan struct{})
}

// Close wakes every waiter for good.
func (w *Window) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.wake)
	}
}

// Consumed is the receiving side's count: Add returns the ack to send
// (0: none yet).
type Consumed struct {
	total, lastAck uint64
}

// Add counts n bytes handed on and returns the cumulative total when an
// ack is due.
func (c *Consumed) Add(n int) uint64 {
	c.total += uint64(n)
	if c.total-c.lastAck >= AckEvery {
		c.lastAck = c.total
		return c.total
	}
	return 0
}

// Flush returns the total when bytes are unacknowledged (0: none).
func (c *Consumed) Flush() uint64 {
	if c.total > c.lastAck {
		c.lastAck = c.total
		return c.total
	}
	return 0
}
