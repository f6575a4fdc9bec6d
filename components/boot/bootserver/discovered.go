package bootserver

import (
	"net"
	"sort"
	"sync"
	"time"
)

// Discovered is a machine that asked this site to boot and that nobody
// prepared: what the site reports in its status ("discovered") and
// `bcgw discovered SITE` lists, so an operator sees new hardware plugged
// in before anyone has its MAC.
type Discovered struct {
	MAC string `json:"mac"`
	// Arch is the client's PXE architecture as proxy DHCP read it
	// (bios, uefi-x86-64, uefi-arm64), "" when it came by iPXE directly.
	Arch      string    `json:"arch,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	Count     int       `json:"count"`
}

// MaxDiscovered bounds the list: the machines seen last are kept.
const MaxDiscovered = 256

// Discoveries keeps the discovered machines in memory.
type Discoveries struct {
	mu      sync.Mutex
	by      map[string]*Discovered
	Now     func() time.Time
	Changed func() // called after a machine is first seen
}

// Saw records mac (and its architecture, when known).
func (d *Discoveries) Saw(mac net.HardwareAddr, arch string) {
	if len(mac) != 6 {
		return
	}
	now := time.Now
	if d.Now != nil {
		now = d.Now
	}
	d.mu.Lock()
	if d.by == nil {
		d.by = map[string]*Discovered{}
	}
	k := mac.String()
	x, ok := d.by[k]
	if !ok {
		x = &Discovered{MAC: k, FirstSeen: now().UTC()}
		d.by[k] = x
	}
	x.LastSeen, x.Count = now().UTC(), x.Count+1
	if arch != "" {
		x.Arch = arch
	}
	if len(d.by) > MaxDiscovered {
		oldest := ""
		for m, y := range d.by {
			if oldest == "" || y.LastSeen.Before(d.by[oldest].LastSeen) {
				oldest = m
			}
		}
		delete(d.by, oldest)
	}
	changed := d.Changed
	d.mu.Unlock()
	if !ok && changed != nil {
		changed()
	}
}

// Forget drops a machine once it is prepared.
func (d *Discoveries) Forget(mac string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.by, mac)
}

// List returns the machines, most recently seen first.
func (d *Discoveries) List() []Discovered {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Discovered, 0, len(d.by))
	for _, x := range d.by {
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].LastSeen.Equal(out[j].LastSeen) {
			return out[i].LastSeen.After(out[j].LastSeen)
		}
		return out[i].MAC < out[j].MAC
	})
	return out
}
