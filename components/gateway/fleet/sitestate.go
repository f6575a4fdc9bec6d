package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/boot/bootlease"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
)

// Meta keys of gateways before the desired spec: a site's cache_images
// and its latest StatusReport sections. upgradeStore moves the first into
// the spec and drops the second.
const (
	oldCacheImagesPrefix = "cacheimages/"
	oldStatusPrefix      = "status/"
)

// SetCacheImages records what a site should cache, as site.cache_images of
// its desired spec (a new generation, sent as a patch).
func (s *Fleet) SetCacheImages(node string, images []adminapi.CacheImage) error {
	n, err := s.NodeForSpec(node)
	if err != nil {
		return err
	}
	if n.Role != "site" {
		return fmt.Errorf("node %s is a %s, not a site agent", node, n.Role)
	}
	if images == nil {
		images = []adminapi.CacheImage{}
	}
	gen, err := s.changeSpec(node, func(cur nodespec.Spec) (nodespec.Spec, []byte, error) {
		return setSectionKey(cur, "site", "cache_images", images)
	})
	if err == nil {
		s.log.Info("cache images set", "node", node, "images", len(images), "generation", gen)
	}
	return err
}

// upgradeStore moves what older gateways kept beside the desired spec into
// it (a site's cache_images), drops their status meta (agents report
// again after every Welcome), and restores each site's boot lease from the
// specs, so a restart does not hand a lease that is still running to a
// second agent.
func (s *Fleet) upgradeStore() error {
	old, err := s.store.MetaPrefix(oldCacheImagesPrefix)
	if err != nil {
		return err
	}
	for key, b := range old {
		node := strings.TrimPrefix(key, oldCacheImagesPrefix)
		var images []adminapi.CacheImage
		if json.Unmarshal(b, &images) == nil && images != nil {
			_, err := s.changeSpec(node, func(cur nodespec.Spec) (nodespec.Spec, []byte, error) {
				if m, err := sectionObject(cur, "site"); err == nil && m["cache_images"] != nil {
					return nil, nil, errNoChange
				}
				return setSectionKey(cur, "site", "cache_images", images)
			})
			if err != nil {
				s.log.Warn("cache_images of an older gateway not moved into the spec", "node", node, "err", err)
				if !errors.Is(err, store.ErrNotFound) {
					continue // kept for the next start
				}
			}
		}
		if err := s.store.DeleteMeta(key); err != nil {
			return err
		}
	}
	if err := s.store.DeleteMetaPrefix(oldStatusPrefix); err != nil {
		return err
	}
	nodes, err := s.store.Nodes()
	if err != nil {
		return err
	}
	now := s.now()
	for _, n := range nodes {
		if n.Role != "site" || n.Revoked {
			continue
		}
		rec, err := s.store.Spec(n.ID)
		if err != nil || rec.Generation == 0 {
			continue
		}
		spec, err := nodespec.Decode(rec.Spec)
		if err != nil {
			continue
		}
		m, err := sectionObject(spec, "site")
		if err != nil {
			continue
		}
		var bl bootlease.BootLease
		if json.Unmarshal(m["boot_lease"], &bl) != nil || !bl.Held {
			continue
		}
		if until := time.UnixMilli(bl.ExpiresUnixMS); until.After(now) {
			s.leases.restore(n.Site, n.ID, until)
		}
	}
	return nil
}
