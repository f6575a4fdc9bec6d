package gateway

import (
	"maps"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Heartbeats are coalesced: a heartbeat is written to the store only when
// it says something the store does not hold yet (another applied or
// observed generation, other inventory hashes), or when the node's stored
// last-seen time is seenRefresh old. Every heartbeat wrote the node before:
// with 10,000 agents beating every 15 s that was 667 store transactions a
// second (each an fsync on bbolt) to say "still here", which the live
// session already says. No timer or goroutine is kept per session: the
// check rides on the heartbeat itself.

// seenRefresh is how stale a connected node's stored last-seen time may
// get. A gateway that dies leaves its nodes' last-seen at most this old.
const seenRefresh = 5 * time.Minute

// beatState is what a session last wrote of its heartbeats.
type beatState struct {
	mu                sync.Mutex
	stored            bool // a heartbeat (or the Hello) was written on this session
	at                time.Time
	applied, observed uint64
	hashes            map[string]string
	lastBeat          time.Time // the last heartbeat received, written or not
}

// helloStored notes what the session's Hello wrote.
func (b *beatState) helloStored(now time.Time, applied, observed uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stored, b.at, b.applied, b.observed, b.lastBeat = true, now, applied, observed, now
}

// due reports whether a heartbeat must be written, and notes it as
// received.
func (b *beatState) due(now time.Time, applied, observed uint64, hashes map[string]string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastBeat = now
	return !b.stored || applied != b.applied || observed != b.observed ||
		len(hashes) > 0 && !maps.Equal(hashes, b.hashes) || now.Sub(b.at) >= seenRefresh
}

// wrote notes a heartbeat written.
func (b *beatState) wrote(now time.Time, applied, observed uint64, hashes map[string]string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stored, b.at, b.applied, b.observed = true, now, applied, observed
	if len(hashes) > 0 {
		b.hashes = maps.Clone(hashes)
	}
}

// heartbeat handles one Heartbeat frame of session l.
func (s *Server) heartbeat(l *live, hb *bcdv1.Heartbeat, log interface {
	Info(string, ...any)
	Warn(string, ...any)
}) {
	hashes := hb.GetInventoryHashes()
	if len(hashes) > 0 && !inventoryHashesOK(hashes) {
		log.Warn("heartbeat inventory hashes refused", "sections", len(hashes))
		hashes = nil
	}
	now := s.now().UTC()
	applied, observed := hb.GetAppliedGeneration(), hb.GetObservedGeneration()
	if l.beat.due(now, applied, observed, hashes) {
		if _, err := s.store.UpdateNode(l.nodeID, func(n *store.Node) error {
			n.LastSeen = now
			n.AppliedGeneration, n.ObservedGeneration = applied, observed
			if len(hashes) > 0 {
				n.InventoryHashes, n.InventoryHashesAt = maps.Clone(hashes), now
			}
			return nil
		}); err != nil {
			log.Warn("heartbeat not stored", "err", err)
		} else {
			l.beat.wrote(now, applied, observed, hashes)
		}
	}
	if l.role == "site" {
		s.siteTouch(l.nodeID, l.site)
	}
}
