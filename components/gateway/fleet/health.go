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

// drainLostAfter is how long the database stays unreachable before the
// gateway asks its agents to redial elsewhere. The balancer's health check
// stops sending new agents within seconds (/readyz answers 503), but it no
// longer ends the sessions a gateway holds (docs/decisions.md, "The
// balancer drains, it does not cut"): the gateway ends them itself, once
// it knows its own database is gone, which a loaded gateway's slow health
// answer never says. A blip shorter than this (a PostgreSQL restart)
// moves no session.
var drainLostAfter = 10 * time.Second

// lostRedial is the redial delay the Drain of a database loss asks for
// (the agent adds its jitter), by when the balancer marked this gateway
// down.
const lostRedial = time.Second

type dbHealth struct {
	mu sync.Mutex
	adminapi.DatabaseHealth
	drained bool // this outage's Drain was sent
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
	defer func() {
		if !h.Reachable && !h.drained && now.Sub(h.Since) >= drainLostAfter {
			h.drained = true
			go func() {
				n := s.hub.DrainLive("gateway lost its database", lostRedial)
				s.log.Warn("sessions drained: the database stays unreachable; the agents redial through the balancer to another gateway", "sessions", n)
			}()
		}
	}()
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
		h.Reachable, h.Since, h.Error, h.drained = true, now, "", false
	}
}

// Health is this gateway's health view.
func (s *Fleet) Health() adminapi.HealthView {
	s.health.mu.Lock()
	db := s.health.DatabaseHealth
	s.health.mu.Unlock()
	return adminapi.HealthView{ServerName: s.cfg.ServerName, Version: buildinfo.Version, Sessions: s.hub.Count(), Database: db}
}
