// Package bootlease is a site's boot lease: the gateway grants it to one
// site agent per site at a time, and only the holder's boot server answers
// the site's machines. The gateway sends it as the site section of the
// desired state; the agent keeps it until its expiry on its own monotonic
// clock, so a lost session ends the lease by itself.
package bootlease

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// SiteSpec is the site section of the desired state (a patch carrying only
// this section).
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

// Apply takes a desired-state patch; serverNow is the agent's working
// clock (gateway time) when it arrived. A spec without a site section
// changes nothing.
func (l *Lease) Apply(spec []byte, serverNow time.Time) error {
	var probe struct {
		Site *struct {
			BootLease *BootLease `json:"boot_lease"`
		} `json:"site"`
	}
	if err := json.Unmarshal(spec, &probe); err != nil {
		return fmt.Errorf("desired state site section: %w", err)
	}
	if probe.Site == nil || probe.Site.BootLease == nil {
		return nil
	}
	var s SiteSpec
	s.Site.BootLease = *probe.Site.BootLease
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock()
	l.held = s.Site.BootLease.Held
	l.until = time.Time{}
	if l.held {
		left := time.UnixMilli(s.Site.BootLease.ExpiresUnixMS).Sub(serverNow)
		l.until = now.Add(left)
	}
	return nil
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
