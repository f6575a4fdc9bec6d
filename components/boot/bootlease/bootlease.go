// Package bootlease is a site's boot lease: the gateway grants it to one
// site agent per site at a time, and only the holder's boot server answers
// the site's machines. The gateway sends it as the site section of the
// desired state; the agent keeps it until its expiry on its own monotonic
// clock, so a lost session ends the lease by itself.
package bootlease

import (
	"sync"
	"time"
)

// SiteSpec is a NodeSpec carrying only the site section's boot lease (the
// gateway's patch).
type SiteSpec struct {
	Site struct {
		BootLease BootLease `json:"boot_lease"`
	} `json:"site"`
}

// BootLease says whether the agent holds the lease and until when, in
// gateway time.
type BootLease struct {
	Held          bool  `json:"held"`
	ExpiresUnixMS int64 `json:"expires_unix_ms,omitempty"`
}

// Lease is the agent's view; safe for concurrent use. The zero value holds
// nothing.
type Lease struct {
	mu    sync.Mutex
	held  bool
	until time.Time // local monotonic deadline
	now   func() time.Time
}

// Deadline is the local time a lease granted at arrival (local, with its
// monotonic reading) ends, when the gateway's clock read serverNow then:
// only the interval the gateway gave counts, never the two clocks' offset.
func (b BootLease) Deadline(serverNow, local time.Time) time.Time {
	if !b.Held {
		return time.Time{}
	}
	return local.Add(time.UnixMilli(b.ExpiresUnixMS).Sub(serverNow))
}

// Set holds the lease until the local deadline until, or releases it.
func (l *Lease) Set(held bool, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held, l.until = held, until
	if !held {
		l.until = time.Time{}
	}
}

// State returns what was Set last.
func (l *Lease) State() (held bool, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held, l.until
}

func (l *Lease) clock() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// Active reports whether this agent holds the lease now.
func (l *Lease) Active() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held && l.clock().Before(l.until)
}

// Left is how long the lease has left (0 when not held).
func (l *Lease) Left() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		return 0
	}
	return max(l.until.Sub(l.clock()), 0)
}
