package agentsvc

import (
	"context"
	"sync"
	"time"
)

// Session set-up admission: a new session costs its gateway three store
// calls before its Welcome and spec are out (the node read; its epoch,
// record and notice to the other gateways in one transaction; its report,
// pending commands and spec in one read). When a gateway is killed, thousands of its agents redial
// into the others at once; with every set-up at once, they took every
// database connection for seconds, and the live sessions' commands and
// results queued behind them (a p99 of seconds). So at most setupSlots
// set-ups run at once, half the database pool, and the other half stays
// for the sessions already live. A set-up that waited setupQueueMax for a
// slot is refused with the busy pushback, before it cost anything: its
// agent comes back on the same connection after the pushback and its
// jitter, and the gateway works through the storm at the rate its
// database takes set-ups.

// setupQueueMax is how long a session waits for a set-up slot.
const setupQueueMax = 5 * time.Second

// DefaultSetupSlots is how many session set-ups run at once when the
// gateway is given no number.
const DefaultSetupSlots = 8

type setupGate struct {
	slots   chan struct{}
	maxWait time.Duration
}

func newSetupGate(n int, maxWait time.Duration) *setupGate {
	if n <= 0 {
		n = DefaultSetupSlots
	}
	return &setupGate{slots: make(chan struct{}, n), maxWait: maxWait}
}

// enter waits for a set-up slot (at most maxWait, or until ctx ends) and
// returns the function that gives it back, which may be called more than
// once; ok is false when no slot came.
func (g *setupGate) enter(ctx context.Context) (release func(), ok bool) {
	t := time.NewTimer(g.maxWait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
	case <-t.C:
		return func() {}, false
	case <-ctx.Done():
		return func() {}, false
	}
	var once sync.Once
	return func() { once.Do(func() { <-g.slots }) }, true
}
