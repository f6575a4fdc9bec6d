package agentsvc

import (
	"maps"

	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// heartbeat handles one Heartbeat frame of session l.
func (s *Service) heartbeat(l *hub.Live, hb *bcdv1.Heartbeat, log interface {
	Info(string, ...any)
	Warn(string, ...any)
}) {
	hashes := hb.GetInventoryHashes()
	if len(hashes) > 0 && !fleet.InventoryHashesOK(hashes) {
		log.Warn("heartbeat inventory hashes refused", "sections", len(hashes))
		hashes = nil
	}
	now := s.now().UTC()
	applied, observed := hb.GetAppliedGeneration(), hb.GetObservedGeneration()
	if l.Beat.Due(now, applied, observed, hashes) {
		if _, err := s.store.UpdateNode(l.NodeID, func(n *store.Node) error {
			n.LastSeen = now
			n.AppliedGeneration, n.ObservedGeneration = applied, observed
			if len(hashes) > 0 {
				n.InventoryHashes, n.InventoryHashesAt = maps.Clone(hashes), now
			}
			return nil
		}); err != nil {
			log.Warn("heartbeat not stored", "err", err)
		} else {
			l.Beat.Wrote(now, applied, observed, hashes)
		}
	}
	if l.Role == "site" {
		s.SiteTouch(l.NodeID, l.Site)
	}
}
