package fleet

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/boot/bootlease"
	"github.com/better-compute/bcd/components/gateway/store"
)

// DefaultLeaseTTL is how long a boot lease lasts without a renewal: a site
// agent renews it with every heartbeat, and loses it this long after its
// session ended.
const DefaultLeaseTTL = 45 * time.Second

// leases grants each site's boot lease to one site agent at a time, so
// only one boot server answers a site's machines.
//
// On a store several gateways share, the lease is a row of that store
// (store.Shared.TouchLease), so one site agent holds it whichever gateway
// its session is on; the map then stays empty.
type leases struct {
	mu     sync.Mutex
	ttl    time.Duration
	by     map[string]*lease // site -> lease
	shared store.Shared
}

// leaseName is a site's boot lease in a shared store.
func leaseName(site string) string { return "boot/" + site }

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
func (ls *leases) touch(site, node string, now time.Time) (held bool, until time.Time, changed bool, err error) {
	if ls.shared != nil {
		return ls.shared.TouchLease(leaseName(site), node, now, ls.ttl)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.by[site]
	switch {
	case l == nil || now.After(l.expires):
		changed = l == nil || l.holder != node
		l = &lease{holder: node}
		ls.by[site] = l
	case l.holder != node:
		return false, time.Time{}, false, nil
	}
	l.expires = now.Add(ls.ttl)
	return true, l.expires, changed, nil
}

// restore records a lease granted before a restart (from the desired
// spec): the later expiry wins when a site has two.
func (ls *leases) restore(site, node string, until time.Time) {
	if ls.shared != nil {
		return // the lease's row outlives the gateway
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.by[site]; l == nil || until.After(l.expires) {
		ls.by[site] = &lease{holder: node, expires: until}
	}
}

// holder returns a site's current holder.
func (ls *leases) holder(site string, now time.Time) string {
	if ls.shared != nil {
		h, _ := ls.shared.LeaseHolder(leaseName(site), now)
		return h
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.by[site]; l != nil && !now.After(l.expires) {
		return l.holder
	}
	return ""
}

// SiteTouch renews or grants a site agent's boot lease, or records that
// it does not hold it, as the site.boot_lease of the node's desired spec:
// a change is a new generation, sent to the agent as a patch. The lease is
// decided under the node's spec lock, so renewals are stored in order.
func (s *Fleet) SiteTouch(node, site string) {
	unlock := s.specLocks.lock(node)
	defer unlock()
	held, until, changed, err := s.leases.touch(site, node, s.now())
	if err != nil {
		// Unknown: the spec keeps what it said; the next heartbeat asks again.
		s.log.Warn("boot lease not decided", "site", site, "node", node, "err", err)
		return
	}
	if changed {
		s.log.Info("boot lease granted", "site", site, "node", node, "until", until.UTC())
	}
	want := bootlease.BootLease{Held: held}
	if held {
		want.ExpiresUnixMS = until.UnixMilli()
	}
	_, err = s.changeSpecLocked(node, func(cur nodespec.Spec) (nodespec.Spec, []byte, error) {
		if !held {
			// Not held: say so once (a lease the spec still shows as held
			// has expired by now; the agent is told plainly).
			if m, err := sectionObject(cur, "site"); err == nil {
				var had bootlease.BootLease
				if b, ok := m["boot_lease"]; ok && json.Unmarshal(b, &had) == nil && had == want {
					return nil, nil, errNoChange
				}
			}
		}
		return setSectionKey(cur, "site", "boot_lease", want)
	})
	if err != nil {
		s.log.Warn("boot lease not stored in the desired spec", "site", site, "node", node, "err", err)
	}
}

// handLapsedLeases hands a lapsed lease to another connected site agent
// of the same site (every third of the lease's lifetime).
func (s *Fleet) handLapsedLeases() {
	for _, l := range s.hub.All() {
		if l.Role != "site" {
			continue
		}
		if s.leases.holder(l.Site, s.now()) == "" {
			s.SiteTouch(l.NodeID, l.Site)
		}
	}
}
