package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape serves m's handler once and parses the text it writes with the
// Prometheus text parser.
func scrape(t *testing.T, m *Metrics) (string, map[string]*familyView) {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("the metrics do not parse as Prometheus text: %v\n%s", err, body)
	}
	out := map[string]*familyView{}
	for name, f := range fams {
		v := &familyView{}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			v.labels = append(v.labels, labels)
			switch {
			case m.GetCounter() != nil:
				v.values = append(v.values, m.GetCounter().GetValue())
			case m.GetGauge() != nil:
				v.values = append(v.values, m.GetGauge().GetValue())
			case m.GetHistogram() != nil:
				v.values = append(v.values, float64(m.GetHistogram().GetSampleCount()))
			}
		}
		out[name] = v
	}
	return string(body), out
}

type familyView struct {
	labels []map[string]string
	values []float64 // a histogram's sample count
}

func (f *familyView) value(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	if f == nil {
		t.Fatalf("no %s", name)
	}
next:
	for i, l := range f.labels {
		for k, v := range want {
			if l[k] != v {
				continue next
			}
		}
		return f.values[i]
	}
	t.Fatalf("%s has no series %v (has %v)", name, want, f.labels)
	return 0
}

// TestMetricsText: every metric docs/bcgw.md lists is written, with the
// gateway's name as a label, and what was counted is what is scraped.
func TestMetricsText(t *testing.T) {
	sessions, up := 3, true
	m := New("gw-a", Gauges{Sessions: func() int { return sessions }, DatabaseUp: func() bool { return up }})
	m.Joined("node", true, nil)
	m.Joined("node", false, nil) // a TPM challenge: neither
	m.Joined("site", true, nil)
	m.Joined("node", false, connect.NewError(connect.CodeResourceExhausted, errors.New("rate")))
	m.Joined("node", false, connect.NewError(connect.CodePermissionDenied, errors.New("token")))
	m.Joined("node", false, errors.New("plain"))
	m.SessionRefused("busy")
	t0 := time.Now()
	m.CommandSent("c1", t0)
	m.CommandSent("c1", t0.Add(time.Second)) // sent again: the first send counts
	m.CommandResult("c1", t0.Add(40*time.Millisecond))
	m.CommandResult("c1", t0.Add(time.Minute)) // a second copy: nothing
	m.CommandResult("c9", t0)                  // never sent here: nothing
	m.ResultRetrying(1)
	m.ResultRetrying(1)
	m.ResultRetrying(-1)
	m.StoreOp("SetResult", 2*time.Millisecond)
	m.StoreOp("SetResult", 3*time.Millisecond)
	m.StoreOp("Node", time.Millisecond)
	m.NoticeListenerLost()
	m.NoticeUnsent()
	m.NoticeMadeUp("command", 4)
	m.NoticeMadeUp("spec", 0)

	body, f := scrape(t, m)
	gw := map[string]string{"gateway": "gw-a"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"bcgw_sessions", gw, 3},
		{"bcgw_database_up", gw, 1},
		{"bcgw_joins_total", map[string]string{"gateway": "gw-a", "role": "node"}, 1},
		{"bcgw_joins_total", map[string]string{"role": "site"}, 1},
		{"bcgw_join_refusals_total", map[string]string{"reason": "resource_exhausted"}, 1},
		{"bcgw_join_refusals_total", map[string]string{"reason": "permission_denied"}, 1},
		{"bcgw_join_refusals_total", map[string]string{"reason": "unknown"}, 1},
		{"bcgw_session_refusals_total", map[string]string{"reason": "busy"}, 1},
		{"bcgw_command_round_trip_seconds", gw, 1},
		{"bcgw_results_pending_ack", gw, 1},
		{"bcgw_store_seconds", map[string]string{"op": "SetResult"}, 2},
		{"bcgw_store_seconds", map[string]string{"op": "Node"}, 1},
		{"bcgw_notice_listener_lost_total", gw, 1},
		{"bcgw_notices_unsent_total", gw, 1},
		{"bcgw_notices_made_up_total", map[string]string{"kind": "command"}, 4},
	} {
		if got := f[c.name].value(t, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// The round trip is 40 ms: in the 50 ms bucket, not the 25 ms one.
	for _, want := range []string{`bcgw_command_round_trip_seconds_bucket{gateway="gw-a",le="0.025"} 0`, `bcgw_command_round_trip_seconds_bucket{gateway="gw-a",le="0.05"} 1`,
		"process_resident_memory_bytes", "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in\n%s", want, body)
		}
	}
	sessions, up = 0, false
	_, f = scrape(t, m)
	if f["bcgw_sessions"].value(t, "bcgw_sessions", gw) != 0 || f["bcgw_database_up"].value(t, "bcgw_database_up", gw) != 0 {
		t.Error("the gauges are not read at the scrape")
	}
}

// TestSentIsBounded: sending times are kept for at most maxSent commands
// whose results never come; the oldest (over an hour) go first.
func TestSentIsBounded(t *testing.T) {
	m := New("gw", Gauges{})
	t0 := time.Now()
	for i := range maxSent {
		m.CommandSent("x"+strconv.Itoa(i), t0)
	}
	m.CommandSent("late", t0.Add(2*time.Hour))
	if n := len(m.sent); n != 1 {
		t.Fatalf("%d sending times kept after the hour-old ones were pruned, want 1", n)
	}
	for i := range maxSent + 10 {
		m.CommandSent("y"+strconv.Itoa(i), t0.Add(2*time.Hour))
	}
	if n := len(m.sent); n > maxSent {
		t.Fatalf("%d sending times kept, at most %d", n, maxSent)
	}
}

// A nil *Metrics counts nothing and does not panic.
func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.Joined("node", true, nil)
	m.SessionRefused("busy")
	m.CommandSent("c", time.Now())
	m.CommandResult("c", time.Now())
	m.ResultRetrying(1)
	m.StoreOp("x", time.Second)
	m.NoticeListenerLost()
	m.NoticeUnsent()
	m.NoticeMadeUp("command", 1)
}
