// Package metrics is bcgw's own metrics, in the Prometheus text format an
// operator scrapes from `bcgw serve --metrics ADDR` (docs/bcgw.md,
// "Metrics"): sessions, joins and refusals, the command round trip,
// results waiting for the store, the store's latency, whether the
// database answers, and the notices between gateways lost and made up.
// Every gateway's metrics carry its name as the label gateway, so the
// sessions of a fleet's gateways add up.
//
// The package is at the bottom of the gateway's packages: the fleet
// logic, the agent service and the wiring each count what they see.
package metrics

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is one gateway's metrics. The zero of nothing: make it with New.
// A nil *Metrics counts nothing (tests that build a fleet without one).
type Metrics struct {
	reg *prometheus.Registry

	joins          *prometheus.CounterVec
	joinRefusals   *prometheus.CounterVec
	sessionRefused *prometheus.CounterVec
	roundTrip      prometheus.Histogram
	resultsPending prometheus.Gauge
	storeSeconds   *prometheus.HistogramVec
	noticesLost    prometheus.Counter
	noticesUnsent  prometheus.Counter
	noticesMadeUp  *prometheus.CounterVec

	// sent is when this gateway sent each command still waiting for its
	// result (the round trip's start); bounded by maxSent.
	mu   sync.Mutex
	sent map[string]time.Time
}

// maxSent bounds the commands whose sending time is kept (prune).
const maxSent = 100_000

// Gauges are read when scraped, from the gateway's own state.
type Gauges struct {
	Sessions   func() int  // live sessions held by this gateway
	DatabaseUp func() bool // the last check of the store answered
	// PoolWaits, on PostgreSQL: how many store calls found every pool
	// connection taken, and how long they waited in all.
	PoolWaits func() (n int64, wait time.Duration)
}

// New makes a gateway's metrics, labelled with its name, reading gauges
// when scraped.
func New(gateway string, g Gauges) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), sent: map[string]time.Time{}}
	r := prometheus.WrapRegistererWith(prometheus.Labels{"gateway": gateway}, m.reg)
	m.joins = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcgw_joins_total",
		Help: "Joins admitted (a certificate issued), by role."}, []string{"role"})
	m.joinRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcgw_join_refusals_total",
		Help: "Joins refused, by reason: the RPC's error code (resource_exhausted is the join rate)."}, []string{"reason"})
	m.sessionRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcgw_session_refusals_total",
		Help: "Sessions refused before they started, by reason: busy (--max-sessions), revoked, draining, setup_queue (waited 5 s for a set-up slot), handshake_queue (a connection closed unanswered after waiting 5 s for its TLS handshake)."}, []string{"reason"})
	m.roundTrip = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bcgw_command_round_trip_seconds",
		Help:    "From a command sent on a session of this gateway to its result stored.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800}})
	m.resultsPending = prometheus.NewGauge(prometheus.GaugeOpts{Name: "bcgw_results_pending_ack",
		Help: "Results an agent sent that the store refused and that are being stored again before they are acked."})
	m.storeSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "bcgw_store_seconds",
		Help:    "Latency of the store's operations (bbolt or PostgreSQL), by operation.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}, []string{"op"})
	m.noticesLost = prometheus.NewCounter(prometheus.CounterOpts{Name: "bcgw_notice_listener_lost_total",
		Help: "Times the listener for the other gateways' notices lost its connection (notices sent meanwhile are lost)."})
	m.noticesUnsent = prometheus.NewCounter(prometheus.CounterOpts{Name: "bcgw_notices_unsent_total",
		Help: "Notices this gateway failed to send to the others."})
	m.noticesMadeUp = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcgw_notices_made_up_total",
		Help: "What the sweep and the catch-up did in place of a lost notice: commands sent again, specs sent again."}, []string{"kind"})
	r.MustRegister(m.joins, m.joinRefusals, m.sessionRefused, m.roundTrip, m.resultsPending, m.storeSeconds,
		m.noticesLost, m.noticesUnsent, m.noticesMadeUp)
	if g.Sessions != nil {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcgw_sessions",
			Help: "Live agent sessions held by this gateway."}, func() float64 { return float64(g.Sessions()) }))
	}
	if g.DatabaseUp != nil {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcgw_database_up",
			Help: "1 while the store answered its last check (every 2 s), else 0."}, func() float64 {
			if g.DatabaseUp() {
				return 1
			}
			return 0
		}))
	}
	if g.PoolWaits != nil {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcgw_store_pool_waits_total",
			Help: "Store calls that found every PostgreSQL pool connection taken."}, func() float64 { n, _ := g.PoolWaits(); return float64(n) }))
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcgw_store_pool_wait_seconds_total",
			Help: "Time store calls waited for a PostgreSQL pool connection, in all."}, func() float64 { _, d := g.PoolWaits(); return d.Seconds() }))
	}
	// The process's own: CPU, memory, file descriptors, goroutines.
	m.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Joined counts a Join: admitted (err nil and a result), a TPM challenge
// (err nil, no result: not counted), or refused.
func (m *Metrics) Joined(role string, admitted bool, err error) {
	if m == nil {
		return
	}
	switch {
	case err != nil:
		m.joinRefusals.WithLabelValues(Reason(err)).Inc()
	case admitted:
		m.joins.WithLabelValues(role).Inc()
	}
}

// SessionRefused counts a session refused before it started.
func (m *Metrics) SessionRefused(reason string) {
	if m == nil {
		return
	}
	m.sessionRefused.WithLabelValues(reason).Inc()
}

// Reason is an RPC error's code as a label ("unknown" for an error that
// carries none).
func Reason(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code().String()
	}
	return connect.CodeUnknown.String()
}

// CommandSent notes when command id went out on a session; its round
// trip ends at CommandResult.
func (m *Metrics) CommandSent(id string, at time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sent[id]; ok {
		return // sent again (a new session, the sweep): the first send counts
	}
	if len(m.sent) >= maxSent {
		m.prune(at)
	}
	m.sent[id] = at
}

// prune forgets sending times over an hour old, and all of them when
// that is not enough (their round trips are then not observed).
func (m *Metrics) prune(now time.Time) {
	for id, t := range m.sent {
		if now.Sub(t) > time.Hour {
			delete(m.sent, id)
		}
	}
	if len(m.sent) >= maxSent {
		clear(m.sent)
	}
}

// CommandResult observes command id's round trip when this gateway sent
// it; a copy of a result already seen, or a command sent elsewhere,
// observes nothing.
func (m *Metrics) CommandResult(id string, at time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	t, ok := m.sent[id]
	delete(m.sent, id)
	m.mu.Unlock()
	if ok {
		m.roundTrip.Observe(at.Sub(t).Seconds())
	}
}

// ResultRetrying counts a result being stored again (+1) and done (-1).
func (m *Metrics) ResultRetrying(delta int) {
	if m == nil {
		return
	}
	m.resultsPending.Add(float64(delta))
}

// StoreOp observes one store operation's latency.
func (m *Metrics) StoreOp(op string, d time.Duration) {
	if m == nil {
		return
	}
	m.storeSeconds.WithLabelValues(op).Observe(d.Seconds())
}

// NoticeListenerLost counts the notice listener's lost connection.
func (m *Metrics) NoticeListenerLost() {
	if m != nil {
		m.noticesLost.Inc()
	}
}

// NoticeUnsent counts a notice that was not sent.
func (m *Metrics) NoticeUnsent() {
	if m != nil {
		m.noticesUnsent.Inc()
	}
}

// NoticeMadeUp counts what stood in for a lost notice: kind is "command"
// (a command sent again by the sweep) or "spec" (a spec sent again by the
// catch-up).
func (m *Metrics) NoticeMadeUp(kind string, n int) {
	if m != nil && n > 0 {
		m.noticesMadeUp.WithLabelValues(kind).Add(float64(n))
	}
}
