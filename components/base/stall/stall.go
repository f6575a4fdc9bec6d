// Package stall ends a transfer that stops moving: a snapshot's upload, a
// snapshot's or a base image's download. Watch counts the bytes a
// transfer moves and cancels its context with ErrStalled when a window
// (2 minutes by default) moved fewer than its minimum (1 MiB), so a
// server that stops sending, or stops reading, does not hold the node's
// work until a deadline far away. docs/instances.md, "Snapshots".
package stall

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// Defaults: a transfer moving less than 1 MiB in 2 minutes ends.
const (
	DefaultWindow = 2 * time.Minute
	DefaultMin    = 1 << 20
)

// ErrStalled is the cause of a context Watch cancelled.
var ErrStalled = errors.New("transfer stalled")

// Rule is the window and the least a transfer moves in it; zero values
// are the defaults.
type Rule struct {
	Window time.Duration
	Min    int64
}

func (r Rule) norm() Rule {
	if r.Window <= 0 {
		r.Window = DefaultWindow
	}
	if r.Min <= 0 {
		r.Min = DefaultMin
	}
	return r
}

// String says the rule in words, for errors.
func (r Rule) String() string {
	r = r.norm()
	return fmt.Sprintf("less than %d bytes in %s", r.Min, r.Window)
}

// Counter counts the bytes a watched transfer moved.
type Counter struct{ n atomic.Int64 }

// Add counts n bytes.
func (c *Counter) Add(n int) { c.n.Add(int64(n)) }

// Total is every byte counted.
func (c *Counter) Total() int64 { return c.n.Load() }

// Reader counts what r reads into c.
func (c *Counter) Reader(r io.Reader) io.Reader { return &reader{r: r, c: c} }

type reader struct {
	r io.Reader
	c *Counter
}

func (r *reader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.c.Add(n)
	return n, err
}

// Watch returns a context cancelled with ErrStalled (context.Cause) when
// a window of rule moves fewer than its minimum bytes through the
// counter, and a stop to call when the transfer ends.
func Watch(ctx context.Context, rule Rule) (context.Context, *Counter, context.CancelFunc) {
	rule = rule.norm()
	ctx, cancel := context.WithCancelCause(ctx)
	c := &Counter{}
	go func() {
		t := time.NewTicker(rule.Window)
		defer t.Stop()
		last := int64(0)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				now := c.Total()
				if now-last < rule.Min {
					cancel(fmt.Errorf("%w: %s", ErrStalled, rule))
					return
				}
				last = now
			}
		}
	}()
	return ctx, c, func() { cancel(context.Canceled) }
}

// Err is what a transfer that failed under a watched ctx reports: the
// stall when Watch ended it, else err.
func Err(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrStalled) {
		return cause
	}
	return err
}
