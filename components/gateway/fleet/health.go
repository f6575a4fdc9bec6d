package fleet

import (
	"context"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// How often and how patiently the database is pinged.
var (
	healthEvery   = 2 * time.Second
	healthTimeout = 3 * time.Second
)

type dbHealth struct {
	mu sync.Mutex
	adminapi.DatabaseHealth
}

func (s *Fleet) startHealth() {
	backend := "bbolt"
	if s.cfg.Database != "" {
		backend = "postgresql"
	}
	now := s.now()
	s.health.DatabaseHealth = adminapi.DatabaseHealth{Backend: backend, Reachable: true, Since: now, Checked: now}
}

// every runs f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// checkDatabase pings the database once and logs a change.
func (s *Fleet) checkDatabase(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, healthTimeout)
	err := s.store.Ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	now := s.now()
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Checked = now
	switch {
	case err != nil && h.Reachable:
		h.Reachable, h.Since, h.Error = false, now, err.Error()
		s.log.Error("database unreachable: this gateway's agents cannot store results or events; "+adminapi.ReadyPath+" answers 503",
			"backend", h.Backend, "err", h.Error)
	case err != nil:
		h.Error = err.Error()
	case !h.Reachable:
		s.log.Info("database reachable again", "backend", h.Backend, "down_for", now.Sub(h.Since).Round(time.Second).String())
		h.Reachable, h.Since, h.Error = true, now, ""
	}
}

// Health is this gateway's health view.
func (s *Fleet) Health() adminapi.HealthView {
	s.health.mu.Lock()
	db := s.health.DatabaseHealth
	s.health.mu.Unlock()
	return adminapi.HealthView{ServerName: s.cfg.ServerName, Version: buildinfo.Version, Sessions: s.hub.Count(), Database: db}
}
