// Package sitespec is a site agent's site section of the NodeSpec, a
// converge.Section: the boot lease the gateway grants (only its holder's
// boot server answers the site's machines) and cache_images, the images
// its image cache keeps warm.
//
//	{"site": {"boot_lease": {"held": true, "expires_unix_ms": 1764630000000},
//	          "cache_images": [{"sha256": "<64 hex>", "url": "https://..."}]}}
//
// The lease's expiry is gateway time: it is read against the working clock
// when the generation arrived, and the lease then runs out on the local
// monotonic clock, so a lost session ends it by itself. A lease loaded
// from data_dir after a restart is never held again until the gateway
// grants it anew. cache_images are pulled in the background by the boot
// server's warmer: the section is PROGRESSING until they are cached, and
// RETRYING when a pull failed. docs/nodespec.md describes the section.
package sitespec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/filehash"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/boot/bootlease"
	"github.com/better-compute/bcd/components/boot/bootserver"
)

// Body is the site section.
type Body struct {
	BootLease   *bootlease.BootLease    `json:"boot_lease,omitempty"`
	CacheImages []bootserver.CacheImage `json:"cache_images,omitempty"`
}

// Section converges the site section.
type Section struct {
	Lease *bootlease.Lease
	// Warmer is nil without [boot] listen: cache_images then fail the
	// section (this agent keeps no cache).
	Warmer *bootserver.Warmer

	mu      sync.Mutex
	arrival converge.Arrival
}

// Name is "site".
func (s *Section) Name() string { return "site" }

// Arrived records when the held generation arrived.
func (s *Section) Arrived(_ uint64, a converge.Arrival) {
	s.mu.Lock()
	s.arrival = a
	s.mu.Unlock()
}

// Decode reads the section strictly.
func Decode(body json.RawMessage) (Body, error) {
	var b Body
	if err := converge.DecodeSection(body, &b); err != nil {
		return b, err
	}
	for i, im := range b.CacheImages {
		if !filehash.ValidDigest(im.SHA256) {
			return b, fmt.Errorf("cache_images[%d]: sha256 %q is not 64 lower-case hex digits", i, im.SHA256)
		}
		u, err := url.Parse(im.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return b, fmt.Errorf("cache_images[%d]: url %q is not an https URL", i, im.URL)
		}
	}
	return b, nil
}

// Check decodes body strictly.
func (s *Section) Check(body json.RawMessage) error { _, err := Decode(body); return err }

// desiredLease is the lease the body asks for now: held only when the
// generation arrived in this process and its expiry has not passed.
func (s *Section) desiredLease(b Body) (bool, time.Time) {
	s.mu.Lock()
	a := s.arrival
	s.mu.Unlock()
	if b.BootLease == nil || !b.BootLease.Held || !a.Fresh {
		return false, time.Time{}
	}
	until := b.BootLease.Deadline(a.ServerNow, a.Local)
	if !time.Now().Before(until) {
		return false, time.Time{}
	}
	return true, until
}

// Plan compares the lease and the cache with the body.
func (s *Section) Plan(_ context.Context, body json.RawMessage) (converge.Plan, error) {
	b, err := Decode(body)
	if err != nil {
		return converge.Plan{}, converge.Terminal(err)
	}
	var p converge.Plan
	held, until := s.desiredLease(b)
	curHeld, curUntil := s.Lease.State()
	switch {
	case held && (!curHeld || !curUntil.Equal(until)):
		p.Changes = append(p.Changes, fmt.Sprintf("hold the boot lease for %s", time.Until(until).Round(time.Second)))
	case !held && curHeld:
		p.Changes = append(p.Changes, "release the boot lease")
	}
	// Cache trouble is a change for Apply to report, never a Plan error:
	// Apply must run to keep the lease current.
	if s.Warmer == nil {
		if len(b.CacheImages) > 0 {
			p.Changes = append(p.Changes, fmt.Sprintf("keep %d cache images (this agent has no cache)", len(b.CacheImages)))
		}
		return p, nil
	}
	want := s.Warmer.Want()
	if !slices.Equal(want, b.CacheImages) && !(len(want) == 0 && len(b.CacheImages) == 0) {
		p.Changes = append(p.Changes, fmt.Sprintf("keep %d cache images", len(b.CacheImages)))
		return p, nil
	}
	done, failed := s.Warmer.Settled()
	switch {
	case !done:
		p.Changes = append(p.Changes, fmt.Sprintf("pulling %d cache images", len(b.CacheImages)))
	case failed != "":
		p.Changes = append(p.Changes, fmt.Sprintf("pull %d cache images again (%s)", len(b.CacheImages), failed))
	}
	return p, nil
}

// Apply sets the lease and hands cache_images to the warmer.
func (s *Section) Apply(_ context.Context, body json.RawMessage, _ converge.Plan) error {
	b, err := Decode(body)
	if err != nil {
		return converge.Terminal(err)
	}
	s.Lease.Set(s.desiredLease(b))
	if s.Warmer == nil {
		if len(b.CacheImages) > 0 {
			return converge.Terminal(errors.New("cache_images need [boot] listen: this site agent keeps no image cache"))
		}
		return nil
	}
	done, failed := s.Warmer.Settled()
	if !slices.Equal(s.Warmer.Want(), b.CacheImages) || (done && failed != "") {
		s.Warmer.SetWant(b.CacheImages)
	}
	if done && failed != "" && slices.Equal(s.Warmer.Want(), b.CacheImages) {
		// Pulling again now; the back-off spaces the next try.
		return fmt.Errorf("cache_images: %s", failed)
	}
	return nil
}
