package hub

import (
	"maps"
	"sync"
	"time"
)

// Heartbeats are coalesced: a heartbeat is written to the store only when
// it says something the store does not hold yet (another applied or
// observed generation, other inventory hashes), or when the node's stored
// last-seen time is SeenRefresh old. Every heartbeat wrote the node before:
// with 10,000 agents beating every 15 s that was 667 store transactions a
// second (each an fsync on bbolt) to say "still here", which the live
// session already says. No timer or goroutine is kept per session: the
// check rides on the heartbeat itself.

// SeenRefresh is how stale a connected node's stored last-seen time may
// get. A gateway that dies leaves its nodes' last-seen at most this old.
const SeenRefresh = 5 * time.Minute

// Beat is what a session last wrote of its heartbeats.
type Beat struct {
	mu                sync.Mutex
	stored            bool // a heartbeat (or the Hello) was written on this session
	at                time.Time
	applied, observed uint64
	hashes            map[string]string
	lastBeat          time.Time // the last heartbeat received, written or not
}

// HelloStored notes what the session's start wrote (its last-seen time
// now and the generations of its Hello) and the inventory hashes the
// node's record held then: a reconnecting agent's first heartbeat, which
// carries the hashes it sent before, is then not written again.
func (b *Beat) HelloStored(now time.Time, applied, observed uint64, hashes map[string]string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stored, b.at, b.applied, b.observed, b.lastBeat = true, now, applied, observed, now
	b.hashes = maps.Clone(hashes)
}

// Due reports whether a heartbeat must be written, and notes it as
// received.
func (b *Beat) Due(now time.Time, applied, observed uint64, hashes map[string]string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastBeat = now
	return !b.stored || applied != b.applied || observed != b.observed ||
		len(hashes) > 0 && !maps.Equal(hashes, b.hashes) || now.Sub(b.at) >= SeenRefresh
}

// Wrote notes a heartbeat written.
func (b *Beat) Wrote(now time.Time, applied, observed uint64, hashes map[string]string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stored, b.at, b.applied, b.observed = true, now, applied, observed
	if len(hashes) > 0 {
		b.hashes = maps.Clone(hashes)
	}
}
