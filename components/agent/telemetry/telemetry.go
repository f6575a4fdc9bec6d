// Package telemetry is the NodeSpec's telemetry section: bcd's own metrics
// (bcd.gpu.*, bcd.host.*) exported over OTLP/HTTP (protobuf) to the
// section's collector.
//
// A Telemetry collects its Sources every interval into one export request
// (a batch) and posts the batches oldest first. A collector that is down
// never slows the agent: collection and export run on Run's own goroutine,
// each post bounded by a timeout, retried after full-jitter back-off. The
// batches waiting are bounded (MaxPending batches, MaxPendingBytes bytes):
// past the bound the oldest is dropped and its points counted as dropped,
// so a gap in the collector's data is either delivered late, with the
// points' own timestamps, or counted in bcd.host.telemetry.dropped_points
// and bcd status. Header values come only from the gateway through a
// sealed SecretRequest (Config.Secret), are held in memory, and are never
// logged. docs/telemetry.md.
package telemetry

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/base/backoff"
)

// Kind says how a metric's points add up.
type Kind int

// The kinds: a Gauge is a value now; a Counter a total since the agent
// started (exported as a cumulative monotonic sum).
const (
	Gauge Kind = iota
	Counter
)

// Metric is one named metric and its points at one collection.
type Metric struct {
	Name, Unit, Description string
	Kind                    Kind
	Points                  []Point
}

// Point is one value of a metric, with the attributes that tell it from
// its siblings (a GPU's uuid and index).
type Point struct {
	Attrs []Attr
	Value float64
}

// Attr is a point's attribute.
type Attr struct{ Key, Value string }

// Value is a metric of one point.
func Value(name, unit, desc string, kind Kind, v float64, attrs ...Attr) Metric {
	return Metric{Name: name, Unit: unit, Description: desc, Kind: kind, Points: []Point{{Attrs: attrs, Value: v}}}
}

// Source reads some metrics. It returns within ctx; what it cannot read
// it leaves out.
type Source func(ctx context.Context) []Metric

// Defaults of the bounds (Config).
const (
	DefaultMaxPending      = 600
	DefaultMaxPendingBytes = 4 << 20
	exportTimeout          = 10 * time.Second
	maxBackoff             = 5 * time.Minute
)

// Config is what a Telemetry exports and how.
type Config struct {
	// Resource is bcd's own resource attributes (service.name, bcd.node.id,
	// bcd.site, bcd.role, ...); the spec's are added to them.
	Resource map[string]string
	// Version is the instrumentation scope's version.
	Version string
	// Sources are read at every collection, in order.
	Sources []Source
	// Secret fetches a header's value from the gateway (session.Secret:
	// signed request, sealed answer); nil refuses a spec with headers.
	Secret func(ctx context.Context, name string) ([]byte, error)
	// MaxPending and MaxPendingBytes bound the batches waiting for the
	// collector (zero: defaults, 600 and 4 MiB).
	MaxPending, MaxPendingBytes int
	Log                         *slog.Logger
	Now                         func() time.Time
}

// Telemetry is the telemetry section and its exporter.
type Telemetry struct {
	cfg    Config
	log    *slog.Logger
	start  time.Time
	reconf chan struct{}

	mu      sync.Mutex
	want    *active // set by Apply, taken by Run
	applied string  // canonical JSON of the spec Apply last set ("" none)
	st      status.Telemetry
	dropped uint64 // points dropped, all time
	// stale is set when the collector refused the headers (401 or 403):
	// Plan then asks for their secrets again (a rotated credential).
	stale bool
	kick  func()
}

// active is one applied spec: its endpoint, client and headers.
type active struct {
	spec     *Spec
	client   *http.Client
	headers  http.Header
	resource map[string]string
}

type batch struct {
	body   []byte
	points int
}

// New returns a Telemetry of cfg; Run runs its exporter.
func New(cfg Config) *Telemetry {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.MaxPendingBytes <= 0 {
		cfg.MaxPendingBytes = DefaultMaxPendingBytes
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Telemetry{cfg: cfg, log: log.With("component", "telemetry"), start: cfg.Now(), reconf: make(chan struct{}, 1)}
}

// Name is the section's name.
func (t *Telemetry) Name() string { return "telemetry" }

// Check decodes body strictly.
func (t *Telemetry) Check(body json.RawMessage) error {
	_, err := Parse(body)
	return err
}

// Plan says whether the exporter runs as body wants.
func (t *Telemetry) Plan(_ context.Context, body json.RawMessage) (converge.Plan, error) {
	s, err := Parse(body)
	if err != nil {
		return converge.Plan{}, converge.Terminal(err)
	}
	want := canonical(s)
	t.mu.Lock()
	applied, endpoint, stale := t.applied, t.st.Endpoint, t.stale
	t.mu.Unlock()
	switch {
	case want == applied && stale && s != nil && len(s.Headers) > 0:
		return converge.Plan{Changes: []string{"fetch the header secrets again: the collector refused them"}}, nil
	case want == applied:
		return converge.Plan{}, nil
	case s == nil:
		return converge.Plan{Changes: []string{"stop exporting to " + endpoint}}, nil
	}
	return converge.Plan{Changes: []string{fmt.Sprintf("export to %s every %s", s.Endpoint, s.Interval())}}, nil
}

// Apply starts, changes or stops the exporter. A spec with headers first
// fetches each header's value from the gateway.
func (t *Telemetry) Apply(ctx context.Context, body json.RawMessage, _ converge.Plan) error {
	s, err := Parse(body)
	if err != nil {
		return converge.Terminal(err)
	}
	var a *active
	if s != nil {
		if a, err = t.prepare(ctx, s); err != nil {
			return err
		}
	}
	t.mu.Lock()
	t.want, t.applied, t.stale = a, canonical(s), false
	t.mu.Unlock()
	select {
	case t.reconf <- struct{}{}:
	default:
	}
	return nil
}

// SetKick gives the section the converge engine's Kick: a collector that
// refuses the headers (401, 403) has the section planned again at once,
// which fetches their secrets anew. Without it the repair pass does.
func (t *Telemetry) SetKick(kick func()) {
	t.mu.Lock()
	t.kick = kick
	t.mu.Unlock()
}

// tlsConfig trusts the spec's CA, or the system roots without one.
func tlsConfig(s *Spec) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.CAPEM != "" {
		pool, err := caPool(s.CAPEM)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// Probe checks that the collector of s takes a TLS connection the
// exporter would trust, within ctx (bcd doctor).
func Probe(ctx context.Context, s *Spec) error {
	tc, err := tlsConfig(s)
	if err != nil {
		return err
	}
	u, err := url.Parse(s.Endpoint)
	if err != nil {
		return err
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	d := tls.Dialer{Config: tc}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return err
	}
	return c.Close()
}

func (t *Telemetry) prepare(ctx context.Context, s *Spec) (*active, error) {
	tc, err := tlsConfig(s)
	if err != nil {
		return nil, converge.Terminal(err)
	}
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true, MaxIdleConns: 1, IdleConnTimeout: 90 * time.Second,
		TLSHandshakeTimeout: exportTimeout, ResponseHeaderTimeout: exportTimeout, Proxy: nil}
	a := &active{spec: s, client: &http.Client{Transport: tr, Timeout: exportTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		headers: http.Header{}, resource: map[string]string{}}
	for k, v := range s.Resource {
		a.resource[k] = v
	}
	for k, v := range t.cfg.Resource {
		a.resource[k] = v
	}
	for _, h := range s.Headers {
		c := textproto.CanonicalMIMEHeaderKey(h)
		if t.cfg.Secret == nil {
			return nil, converge.Terminal(fmt.Errorf("telemetry: header %s needs a secret, which this agent cannot ask for", c))
		}
		v, err := t.cfg.Secret(ctx, SecretPrefix+c)
		if err != nil {
			return nil, fmt.Errorf("telemetry: header %s: %w", c, err)
		}
		if !printable(string(v)) || len(v) == 0 || len(v) > 8<<10 {
			clear(v)
			return nil, converge.Terminal(fmt.Errorf("telemetry: the secret of header %s is not a header value", c))
		}
		a.headers.Set(c, string(v))
		clear(v)
	}
	return a, nil
}

// canonical is the spec as Plan compares it.
func canonical(s *Spec) string {
	if s == nil {
		return ""
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// Status is the exporter as bcd status shows it; nil without a section.
func (t *Telemetry) Status() *status.Telemetry {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.applied == "" {
		return nil
	}
	st := t.st
	return &st
}

// Dropped is how many points were dropped since the agent started.
func (t *Telemetry) Dropped() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}

// Run collects and exports as the applied spec says until ctx ends.
func (t *Telemetry) Run(ctx context.Context) error {
	var (
		cur       *active
		pending   []batch
		bytesHeld int
		collect   = time.NewTimer(time.Hour)
		retry     *time.Timer
		retryC    <-chan time.Time
		failures  int
	)
	collect.Stop()
	defer collect.Stop()
	stopRetry := func() {
		if retry != nil {
			retry.Stop()
		}
		retry, retryC = nil, nil
	}
	defer stopRetry()
	drop := func(b batch, why string) {
		t.mu.Lock()
		t.dropped += uint64(b.points)
		t.st.DroppedPoints = t.dropped
		t.mu.Unlock()
		t.log.Debug("telemetry batch dropped", "points", b.points, "why", why)
	}
	setPending := func() {
		t.mu.Lock()
		t.st.PendingBatches, t.st.PendingBytes = len(pending), bytesHeld
		t.mu.Unlock()
	}
	// send posts the pending batches oldest first until one fails.
	send := func() {
		for len(pending) > 0 && ctx.Err() == nil {
			b := pending[0]
			retryable, err := t.post(ctx, cur, b)
			if err != nil && retryable {
				t.fail(err)
				failures++
				retry = time.NewTimer(backoff.Full(failures-1, time.Second, min(maxBackoff, max(cur.spec.Interval(), time.Second))))
				retryC = retry.C
				break
			}
			pending, bytesHeld = pending[1:], bytesHeld-len(b.body)
			failures = 0
			if err != nil {
				t.fail(err)
				drop(b, "refused")
				continue
			}
			t.delivered(b.points)
		}
		setPending()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.reconf:
			t.mu.Lock()
			next := t.want
			t.mu.Unlock()
			if cur != nil && (next == nil || next.spec.URL() != cur.spec.URL()) {
				for _, b := range pending {
					drop(b, "endpoint changed")
				}
				pending, bytesHeld = nil, 0
				cur.client.CloseIdleConnections()
			}
			cur = next
			stopRetry()
			failures = 0
			collect.Stop()
			t.mu.Lock()
			if cur == nil {
				t.st = status.Telemetry{DroppedPoints: t.dropped}
			} else {
				t.st.Endpoint, t.st.Interval = cur.spec.Endpoint, cur.spec.Interval().String()
			}
			t.mu.Unlock()
			setPending()
			if cur != nil {
				collect.Reset(0)
			}
		case <-collect.C:
			if cur == nil {
				continue
			}
			collect.Reset(cur.spec.Interval())
			b := t.collect(ctx, cur)
			pending = append(pending, b)
			bytesHeld += len(b.body)
			for len(pending) > t.cfg.MaxPending || (bytesHeld > t.cfg.MaxPendingBytes && len(pending) > 1) {
				drop(pending[0], "buffer full")
				bytesHeld -= len(pending[0].body)
				pending = pending[1:]
			}
			setPending()
			if retryC == nil {
				send()
			}
		case <-retryC:
			retry, retryC = nil, nil
			if cur != nil {
				send()
			}
		}
	}
}

// collect reads every source within the interval (at most exportTimeout)
// and encodes one batch.
func (t *Telemetry) collect(ctx context.Context, a *active) batch {
	cctx, cancel := context.WithTimeout(ctx, min(a.spec.Interval(), exportTimeout))
	defer cancel()
	var ms []Metric
	for _, src := range t.cfg.Sources {
		ms = append(ms, src(cctx)...)
	}
	t.mu.Lock()
	dropped := t.dropped
	t.mu.Unlock()
	ms = append(ms, Value("bcd.host.telemetry.dropped_points", "{point}", "points dropped while the collector could not take them", Counter, float64(dropped)))
	body, n := encode(a.resource, ms, t.start, t.cfg.Now(), t.cfg.Version)
	return batch{body: body, points: n}
}

// post sends one batch. retryable says whether a failure may succeed
// later (no answer, 429, 502, 503, 504, and 401 or 403 while the spec has
// headers: their secrets are fetched again); other refusals drop the
// batch.
func (t *Telemetry) post(ctx context.Context, a *active, b batch) (retryable bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.spec.URL(), bytes.NewReader(b.body))
	if err != nil {
		return false, fmt.Errorf("export: %w", err)
	}
	for k, v := range a.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := a.client.Do(req)
	if err != nil {
		return true, fmt.Errorf("export to %s: %w", a.spec.Endpoint, scrub(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusOK:
		rejected, msg, perr := partialSuccess(body)
		if perr == nil && rejected > 0 {
			t.fail(fmt.Errorf("the collector rejected %d points: %s", rejected, trim(clean(msg))))
		}
		return false, nil
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusBadGateway,
		resp.StatusCode == http.StatusServiceUnavailable, resp.StatusCode == http.StatusGatewayTimeout:
		return true, fmt.Errorf("export to %s: %s", a.spec.Endpoint, resp.Status)
	}
	if (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) && len(a.headers) > 0 {
		t.mu.Lock()
		first, kick := !t.stale, t.kick
		t.stale = true
		t.mu.Unlock()
		if first && kick != nil {
			kick()
		}
		// Kept, like a collector that is down, for the headers' new values.
		return true, fmt.Errorf("export to %s refused the headers: %s", a.spec.Endpoint, resp.Status)
	}
	return false, fmt.Errorf("export to %s refused: %s", a.spec.Endpoint, resp.Status)
}

// scrub keeps a transport error's words without the URL Go wraps it in
// (the endpoint is said once by the caller).
func scrub(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) && strings.HasPrefix(err.Error(), "Post ") {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}

func (t *Telemetry) delivered(points int) {
	now := t.cfg.Now()
	t.mu.Lock()
	recovered := t.st.LastError != "" && !t.st.LastErrorAt.IsZero() && t.st.LastExport.Before(t.st.LastErrorAt)
	t.st.LastExport = now.UTC()
	t.st.ExportedPoints += uint64(points)
	t.mu.Unlock()
	if recovered {
		t.log.Info("telemetry export recovered")
	}
}

// fail records err as the last error; it is logged when it differs from
// the one logged before.
func (t *Telemetry) fail(err error) {
	msg := clean(err.Error())
	t.mu.Lock()
	same := t.st.LastError == msg
	t.st.LastError, t.st.LastErrorAt = msg, t.cfg.Now().UTC()
	t.mu.Unlock()
	if !same {
		t.log.Warn("telemetry export failed", "err", msg)
	}
}

// clean keeps one line of printable text.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
