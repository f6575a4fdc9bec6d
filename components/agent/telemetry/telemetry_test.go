package telemetry

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/trust/seal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name, body, wantErr string
	}{
		{name: "none", body: `null`},
		{name: "minimal", body: `{"endpoint":"https://otel.example:4318"}`},
		{name: "full", body: `{"endpoint":"https://otel.example:4318/base","interval_s":15,"resource":{"deployment.environment":"lab"},"headers":["authorization","X-Scope-OrgID"]}`},
		{name: "unknown field", body: `{"endpoint":"https://o:1","every":5}`, wantErr: `unknown field "every"`},
		{name: "no endpoint", body: `{}`, wantErr: "endpoint is required"},
		{name: "plain http", body: `{"endpoint":"http://o:4318"}`, wantErr: "must be https://"},
		{name: "user in the url", body: `{"endpoint":"https://u:p@o:4318"}`, wantErr: "without user"},
		{name: "interval too short", body: `{"endpoint":"https://o","interval_s":-1}`, wantErr: "interval_s -1 is outside"},
		{name: "interval too long", body: `{"endpoint":"https://o","interval_s":3601}`, wantErr: "outside"},
		{name: "a reserved attribute", body: `{"endpoint":"https://o","resource":{"bcd.node.id":"node_other"}}`, wantErr: "bcd's own"},
		{name: "a control character", body: `{"endpoint":"https://o","resource":{"a":"b\n"}}`, wantErr: "printable"},
		{name: "not a header name", body: `{"endpoint":"https://o","headers":["Bad Header"]}`, wantErr: "not a header name"},
		{name: "a header twice", body: `{"endpoint":"https://o","headers":["x-a","X-A"]}`, wantErr: "named twice"},
		{name: "the exporter's header", body: `{"endpoint":"https://o","headers":["content-type"]}`, wantErr: "exporter's own"},
		{name: "a header value in the spec", body: `{"endpoint":"https://o","headers":{"Authorization":"Bearer x"}}`, wantErr: "cannot unmarshal"},
		{name: "not a CA", body: `{"endpoint":"https://o","ca_pem":"hello"}`, wantErr: "PEM CERTIFICATE blocks only"},
		{name: "trailing data", body: `{"endpoint":"https://o"} {}`, wantErr: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(json.RawMessage(tt.body))
			if tt.name == "trailing data" {
				if err == nil {
					t.Fatal("Parse took a body with a second value")
				}
				return
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse(%s) = %v", tt.body, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Parse(%s) = %v, want an error with %q", tt.body, err, tt.wantErr)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"endpoint":"https://o:1","interval_s":5,"resource":{"a":"b"},"headers":["X"]}`, `{"ca_pem":"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----"}`, `null`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse(b)
		if err == nil && s != nil && !strings.HasPrefix(s.Endpoint, "https://") {
			t.Fatalf("Parse(%q) took endpoint %q", b, s.Endpoint)
		}
	})
}

func FuzzPartialSuccess(f *testing.F) {
	f.Add([]byte{0x0a, 0x05, 0x08, 0x03, 0x12, 0x01, 'x'})
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = partialSuccess(b)
	})
}

// collector is a real OTLP/HTTP endpoint on loopback TLS: it decodes each
// request and keeps it with its headers.
type collector struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []request
	hdrs []http.Header
}

func newCollector(t *testing.T, ln net.Listener) *collector {
	c := &collector{}
	c.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		md, err := decodeRequest(b)
		if r.URL.Path != "/v1/metrics" || r.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.reqs, c.hdrs = append(c.reqs, md), append(c.hdrs, r.Header.Clone())
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	if ln != nil {
		c.srv.Listener.Close()
		c.srv.Listener = ln
	}
	c.srv.StartTLS()
	t.Cleanup(c.srv.Close)
	return c
}

func (c *collector) caPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.srv.Certificate().Raw}))
}

func (c *collector) requests() []request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]request{}, c.reqs...)
}

func (c *collector) points() int {
	n := 0
	for _, md := range c.requests() {
		for _, ps := range md.metrics {
			n += len(ps)
		}
	}
	return n
}

// gateway answers a SecretRequest as bcgw does: the node key's signature
// verified, the value sealed to the request's reply key; the node opens
// it with the request's own key.
func gateway(t *testing.T, values map[string]string) func(ctx context.Context, name string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return func(_ context.Context, name string) ([]byte, error) {
		r := &bcdv1.SecretRequest{RequestId: "sec-1", Name: name, WorkflowId: "telemetry"}
		o, err := seal.NewRequest(key, "node_a", r, time.Now())
		if err != nil {
			return nil, err
		}
		if err := seal.VerifyRequest(key.Public(), "node_a", r); err != nil {
			return nil, err
		}
		v, ok := values[name]
		if !ok {
			return nil, errors.New("no secret " + name)
		}
		sealed, err := seal.Seal(r, []byte(v), time.Now())
		if err != nil {
			return nil, err
		}
		return o.OpenSealed(sealed, time.Now())
	}
}

func gpuSource(context.Context) []Metric {
	m := Metric{Name: "bcd.gpu.temperature", Unit: "Cel", Kind: Gauge}
	for i := range 8 {
		m.Points = append(m.Points, Point{Attrs: []Attr{{"gpu.index", string(rune('0' + i))}}, Value: 40 + float64(i)})
	}
	return []Metric{m}
}

func apply(t *testing.T, tel *Telemetry, body string) {
	t.Helper()
	p, err := tel.Plan(context.Background(), json.RawMessage(body))
	if err != nil {
		t.Fatal(err)
	}
	if err := tel.Apply(context.Background(), json.RawMessage(body), p); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestExportWithSecretHeader: metrics reach a real TLS endpoint that only
// the spec's CA vouches for, with bcd's and the spec's resource
// attributes, and the header whose value came sealed from the gateway;
// the value is in no log line, no status and no plan.
func TestExportWithSecretHeader(t *testing.T) {
	const secret = "Bearer tok-5f1c9a02e7"
	c := newCollector(t, nil)
	var logs bytes.Buffer
	tel := New(Config{Resource: map[string]string{"bcd.node.id": "node_a", "service.name": "bcd"}, Version: "test",
		Sources: []Source{gpuSource}, Secret: gateway(t, map[string]string{SecretPrefix + "Authorization": secret}),
		Log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = tel.Run(ctx) }()
	spec, _ := json.Marshal(Spec{Endpoint: c.srv.URL, IntervalS: 1, CAPEM: c.caPEM(), Resource: map[string]string{"deployment.environment": "lab"}, Headers: []string{"authorization"}})
	apply(t, tel, string(spec))
	if p, _ := tel.Plan(ctx, spec); len(p.Changes) != 0 {
		t.Fatalf("Plan after Apply = %v, want converged", p.Changes)
	}
	waitFor(t, "an export", 10*time.Second, func() bool { return len(c.requests()) > 0 })
	md := c.requests()[0]
	if a := md.resource; a["bcd.node.id"] != "node_a" || a["deployment.environment"] != "lab" || a["service.name"] != "bcd" {
		t.Fatalf("resource attributes %v", a)
	}
	temps := md.metrics["bcd.gpu.temperature"]
	if len(temps) != 8 || temps[7].value != 47 || temps[7].attrs["gpu.index"] != "7" || md.counters["bcd.gpu.temperature"] {
		t.Fatalf("bcd.gpu.temperature: %+v", temps)
	}
	if d := md.metrics["bcd.host.telemetry.dropped_points"]; len(d) != 1 || !md.counters["bcd.host.telemetry.dropped_points"] || d[0].start == 0 {
		t.Fatalf("bcd.host.telemetry.dropped_points: %+v", d)
	}
	c.mu.Lock()
	got := c.hdrs[0].Get("Authorization")
	c.mu.Unlock()
	if got != secret {
		t.Fatalf("the collector got Authorization %q", got)
	}
	st := tel.Status()
	if st == nil || st.LastExport.IsZero() || st.ExportedPoints == 0 || st.Endpoint != c.srv.URL {
		t.Fatalf("status %+v", st)
	}
	stb, _ := json.Marshal(st)
	for what, b := range map[string][]byte{"the logs": logs.Bytes(), "the status": stb, "the spec": spec} {
		if bytes.Contains(b, []byte("tok-5f1c9a02e7")) {
			t.Fatalf("the header secret is in %s: %s", what, b)
		}
	}
}

// TestSystemRootsRefuseAPrivateCA: without ca_pem the collector's
// certificate must chain to the system roots, so a private CA is refused
// and nothing is sent.
func TestSystemRootsRefuseAPrivateCA(t *testing.T) {
	c := newCollector(t, nil)
	tel := New(Config{Sources: []Source{gpuSource}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = tel.Run(ctx) }()
	apply(t, tel, `{"endpoint":"`+c.srv.URL+`","interval_s":1}`)
	waitFor(t, "an error", 10*time.Second, func() bool { st := tel.Status(); return st != nil && st.LastError != "" })
	if st := tel.Status(); !strings.Contains(st.LastError, "certificate") || len(c.requests()) != 0 {
		t.Fatalf("status %+v, %d requests", st, len(c.requests()))
	}
}

// TestHeaderWithoutSecret: a header the gateway has no secret for leaves
// the section retrying, and nothing is exported without it.
func TestHeaderWithoutSecret(t *testing.T) {
	tel := New(Config{Secret: gateway(t, nil)})
	body := json.RawMessage(`{"endpoint":"https://127.0.0.1:1","headers":["Authorization"]}`)
	p, _ := tel.Plan(context.Background(), body)
	err := tel.Apply(context.Background(), body, p)
	if err == nil || !strings.Contains(err.Error(), "header Authorization") || converge.IsTerminal(err) {
		t.Fatalf("Apply = %v", err)
	}
	if tel.Status() != nil {
		t.Fatal("a section whose header failed is running")
	}
}

// TestCollectorDownIsBounded: while the collector is down the batches
// wait, at most MaxPending of them; the oldest beyond are dropped and
// counted, and once it is back every batch kept is delivered, so
// delivered + dropped is every point collected.
func TestCollectorDownIsBounded(t *testing.T) {
	c := newCollector(t, nil)
	addr := c.srv.Listener.Addr().String()
	ca := c.caPEM()
	var calls atomic.Int64
	counted := func(ctx context.Context) []Metric { calls.Add(1); return gpuSource(ctx) }
	tel := New(Config{Sources: []Source{counted}, MaxPending: 3})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); _ = tel.Run(ctx) }()
	spec, _ := json.Marshal(Spec{Endpoint: c.srv.URL, IntervalS: 1, CAPEM: ca})
	apply(t, tel, string(spec))
	waitFor(t, "the first export", 10*time.Second, func() bool { return len(c.requests()) > 0 })
	c.srv.Close()
	before := c.points()
	waitFor(t, "points dropped", 15*time.Second, func() bool { st := tel.Status(); return st.DroppedPoints > 0 })
	if st := tel.Status(); st.PendingBatches > 3 || st.LastError == "" {
		t.Fatalf("while down: %+v", st)
	}
	// The same address again, the same certificate.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c2 := &collector{}
	c2.srv = httptest.NewUnstartedServer(c.srv.Config.Handler)
	c2.srv.Listener.Close()
	c2.srv.Listener = ln
	c2.srv.TLS = c.srv.TLS
	c2.srv.StartTLS()
	defer c2.srv.Close()
	waitFor(t, "the backlog delivered", 30*time.Second, func() bool { st := tel.Status(); return st.PendingBatches == 0 && st.LastExport.After(st.LastErrorAt) })
	cancel()
	<-done
	st := tel.Status()
	delivered := c.points()
	if delivered <= before {
		t.Fatalf("nothing delivered after the restart: %d points before, %d after", before, delivered)
	}
	// Every point collected (8 GPU points and the dropped counter per
	// collection) is delivered, counted as dropped, or still waiting.
	collected := uint64(calls.Load()) * 9
	if uint64(delivered) != st.ExportedPoints || collected != st.ExportedPoints+st.DroppedPoints+uint64(st.PendingBatches)*9 {
		t.Fatalf("collected %d points; the collector has %d, the exporter says %d exported, %d dropped, %d batches waiting",
			collected, delivered, st.ExportedPoints, st.DroppedPoints, st.PendingBatches)
	}
	t.Logf("collected %d points: delivered %d, dropped %d", collected, delivered, st.DroppedPoints)
}

// TestRotatedHeaderSecret: the collector refuses the header once its
// value changed at the gateway; the section kicks the engine, plans a
// fetch of the secrets again, and the batches kept meanwhile go out with
// the new value.
func TestRotatedHeaderSecret(t *testing.T) {
	var mu sync.Mutex
	want := "Bearer one"
	c := &collector{}
	c.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ok := r.Header.Get("Authorization") == want
		mu.Unlock()
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		b, _ := io.ReadAll(r.Body)
		md, err := decodeRequest(b)
		if err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.reqs = append(c.reqs, md)
		c.mu.Unlock()
	}))
	c.srv.StartTLS()
	defer c.srv.Close()
	secrets := map[string]string{SecretPrefix + "Authorization": "Bearer one"}
	var smu sync.Mutex
	tel := New(Config{Sources: []Source{gpuSource}, Secret: func(ctx context.Context, name string) ([]byte, error) {
		smu.Lock()
		v := secrets[name]
		smu.Unlock()
		// The real round trip, with the value of now.
		return gateway(t, map[string]string{name: v})(ctx, name)
	}})
	kicked := make(chan struct{}, 1)
	tel.SetKick(func() {
		select {
		case kicked <- struct{}{}:
		default:
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = tel.Run(ctx) }()
	spec, _ := json.Marshal(Spec{Endpoint: c.srv.URL, IntervalS: 1, CAPEM: c.caPEM(), Headers: []string{"Authorization"}})
	apply(t, tel, string(spec))
	waitFor(t, "an export", 10*time.Second, func() bool { return len(c.requests()) > 0 })
	// Rotated at the gateway and at the collector.
	smu.Lock()
	secrets[SecretPrefix+"Authorization"] = "Bearer two"
	smu.Unlock()
	mu.Lock()
	want = "Bearer two"
	mu.Unlock()
	select {
	case <-kicked:
	case <-time.After(10 * time.Second):
		t.Fatal("no kick after the collector refused the header")
	}
	p, err := tel.Plan(ctx, spec)
	if err != nil || len(p.Changes) != 1 || !strings.Contains(p.Changes[0], "header secrets again") {
		t.Fatalf("Plan after a refusal = %v, %v", p.Changes, err)
	}
	if err := tel.Apply(ctx, spec, p); err != nil {
		t.Fatal(err)
	}
	if p, _ := tel.Plan(ctx, spec); len(p.Changes) != 0 {
		t.Fatalf("Plan after the fetch = %v", p.Changes)
	}
	before := len(c.requests())
	waitFor(t, "exports with the new value", 10*time.Second, func() bool {
		st := tel.Status()
		return len(c.requests()) > before && st.PendingBatches == 0
	})
	if st := tel.Status(); st.DroppedPoints != 0 {
		t.Fatalf("%d points dropped across the rotation", st.DroppedPoints)
	}
}
