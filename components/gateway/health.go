package gateway

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/buildinfo"
)

// The gateway's own health: whether its database answers. A gateway
// whose database is lost can hold sessions but store nothing, so every
// call of its agents fails after opTimeout. It says so three ways
// (docs/gateway-store.md, "A database lost while serving"): a log line
// when the database stops and starts answering, `bcgw health` on the
// admin API with the error, and GET /readyz on the agents' port, which a
// balancer's health check reads to send agents to another gateway.

// How often and how patiently the database is pinged.
var (
	healthEvery   = 2 * time.Second
	healthTimeout = 3 * time.Second
)

// ReadyPath is the readiness check on the agents' port: 200 while the
// database answers, 503 when it does not. It names no error (the port is
// public); `bcgw health` does.
const ReadyPath = "/readyz"

// DatabaseHealth is whether the gateway's database answers.
type DatabaseHealth struct {
	Backend   string    `json:"backend"` // "bbolt" or "postgresql"
	Reachable bool      `json:"reachable"`
	Since     time.Time `json:"since"` // when it last changed
	Checked   time.Time `json:"checked"`
	Error     string    `json:"error,omitempty"`
}

// HealthView is `bcgw health`: this gateway, its database and sessions.
type HealthView struct {
	ServerName string         `json:"server_name"`
	Version    string         `json:"version"`
	Sessions   int            `json:"sessions"`
	Database   DatabaseHealth `json:"database"`
}

type dbHealth struct {
	mu sync.Mutex
	DatabaseHealth
}

func (s *Server) startHealth() {
	backend := "bbolt"
	if s.cfg.Database != "" {
		backend = "postgresql"
	}
	now := s.now()
	s.health.DatabaseHealth = DatabaseHealth{Backend: backend, Reachable: true, Since: now, Checked: now}
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
func (s *Server) checkDatabase(ctx context.Context) {
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
		s.log.Error("database unreachable: this gateway's agents cannot store results or events; "+ReadyPath+" answers 503",
			"backend", h.Backend, "err", h.Error)
	case err != nil:
		h.Error = err.Error()
	case !h.Reachable:
		s.log.Info("database reachable again", "backend", h.Backend, "down_for", now.Sub(h.Since).Round(time.Second).String())
		h.Reachable, h.Since, h.Error = true, now, ""
	}
}

// Health is this gateway's health view.
func (s *Server) Health() HealthView {
	s.health.mu.Lock()
	db := s.health.DatabaseHealth
	s.health.mu.Unlock()
	return HealthView{ServerName: s.cfg.ServerName, Version: buildinfo.Version, Sessions: s.hub.Count(), Database: db}
}

func (s *Server) adminHealth(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.Health()) }

// serveReady answers the balancer's health check.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	s.health.mu.Lock()
	ok := s.health.Reachable
	s.health.mu.Unlock()
	switch {
	case !ok:
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("database unreachable\n"))
		return
	case s.hub.Draining():
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("shutting down\n"))
		return
	}
	w.Write([]byte("ready\n"))
}
