package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/agent/telemetry"
	"github.com/better-compute/bcd/components/trust/identity"
)

// Telemetry is the role's part of the telemetry section: the sources of
// its machine's metrics (the node's GPUs and host), exported beside the
// agent's own (session, journal, certificate).
type Telemetry struct {
	Sources []telemetry.Source
}

// newTelemetry builds the telemetry section of an agent: bcd's resource
// attributes, the agent's own metrics, the role's sources, and header
// secrets asked of the gateway through the session (a signed request, a
// sealed answer).
func newTelemetry(c Config, a *identity.Agent, sess func() *session.Session, j *journal.Journal, disp func() *dispatch.Dispatcher,
	cert *atomic.Pointer[tls.Certificate], now func() time.Time) *telemetry.Telemetry {
	own := func(context.Context) []telemetry.Metric {
		s, d := sess(), disp()
		if s == nil || d == nil {
			return nil
		}
		connected, epoch, _ := s.State()
		evs, _, _ := j.Events()
		conn := 0.0
		if connected {
			conn = 1
		}
		left := cert.Load().Leaf.NotAfter.Sub(now()).Seconds()
		return []telemetry.Metric{
			telemetry.Value("bcd.host.session.connected", "1", "1 while a session with the gateway is established", telemetry.Gauge, conn),
			telemetry.Value("bcd.host.session.epoch", "1", "the session's epoch", telemetry.Gauge, float64(epoch)),
			telemetry.Value("bcd.host.journal.event_backlog", "{event}", "events not yet acked by the gateway", telemetry.Gauge, float64(len(evs))),
			telemetry.Value("bcd.host.journal.events_dropped", "{event}", "events the journal dropped at its bound", telemetry.Counter, float64(j.Dropped())),
			telemetry.Value("bcd.host.journal.results_unacked", "{result}", "command results not yet acked", telemetry.Gauge, float64(len(d.Unacked()))),
			telemetry.Value("bcd.host.certificate.expiry", "s", "seconds until the node certificate expires", telemetry.Gauge, left),
		}
	}
	return telemetry.New(telemetry.Config{
		Resource: map[string]string{"service.name": "bcd", "service.version": c.Version, "service.instance.id": a.NodeID,
			"bcd.node.id": a.NodeID, "bcd.site": a.Site, "bcd.role": a.Role},
		Version: c.Version,
		Sources: append([]telemetry.Source{own}, c.Telemetry.Sources...),
		Secret: func(ctx context.Context, name string) ([]byte, error) {
			s := sess()
			if s == nil {
				return nil, errors.New("no session yet")
			}
			return s.Secret(ctx, name, "telemetry", "")
		},
		Log: c.Log.With("node", a.NodeID),
		Now: now,
	})
}
