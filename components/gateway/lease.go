package gateway

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/boot/bootlease"
	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// DefaultLeaseTTL is how long a boot lease lasts without a renewal: a site
// agent renews it with every heartbeat, and loses it this long after its
// session ended.
const DefaultLeaseTTL = 45 * time.Second

// leases grants each site's boot lease to one site agent at a time, so
// only one boot server answers a site's machines.
type leases struct {
	mu  sync.Mutex
	ttl time.Duration
	by  map[string]*lease // site -> lease
	gen uint64
}

type lease struct {
	holder  string
	expires time.Time
}

func newLeases(ttl time.Duration) *leases {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	return &leases{ttl: ttl, by: map[string]*lease{}}
}

// touch grants the site's lease to node when it is free or expired, and
// renews it when node holds it. It reports whether node holds it and until
// when, and whether that changed.
func (ls *leases) touch(site, node string, now time.Time) (held bool, until time.Time, changed bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.by[site]
	switch {
	case l == nil || now.After(l.expires):
		changed = l == nil || l.holder != node
		l = &lease{holder: node}
		ls.by[site] = l
	case l.holder != node:
		return false, time.Time{}, false
	}
	l.expires = now.Add(ls.ttl)
	return true, l.expires, changed
}

// holder returns a site's current holder.
func (ls *leases) holder(site string, now time.Time) string {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.by[site]; l != nil && !now.After(l.expires) {
		return l.holder
	}
	return ""
}

func (ls *leases) next() uint64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.gen++
	return ls.gen
}

// leaseFrame is the DesiredState patch telling a site agent its lease.
func (s *Server) leaseFrame(held bool, until time.Time) *bcdv1.GatewayFrame {
	var spec bootlease.SiteSpec
	spec.Site.BootLease = bootlease.BootLease{Held: held}
	if held {
		spec.Site.BootLease.ExpiresUnixMS = until.UnixMilli()
	}
	b, _ := json.Marshal(spec)
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_DesiredState{DesiredState: &bcdv1.DesiredState{
		Generation: s.leases.next(), Patch: true, Spec: b,
	}}}
}

// siteTouch renews or grants a site agent's lease and tells it.
func (s *Server) siteTouch(n store.Node, l *live, force bool) {
	held, until, changed := s.leases.touch(n.Site, n.ID, s.now())
	if changed {
		s.log.Info("boot lease granted", "site", n.Site, "node", n.ID, "until", until.UTC())
	}
	if held || force {
		l.push(outFrame{f: s.leaseFrame(held, until)})
	}
}

// leaseLoop hands a lapsed lease to another connected site agent of the
// same site, until ctx ends.
func (s *Server) leaseLoop(ctx context.Context) {
	t := time.NewTicker(s.leases.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, l := range s.hub.all() {
			if l.role != "site" {
				continue
			}
			if s.leases.holder(l.site, s.now()) == "" {
				n, err := s.store.Node(l.nodeID)
				if err == nil {
					s.siteTouch(n, l, false)
				}
			}
		}
	}
}
