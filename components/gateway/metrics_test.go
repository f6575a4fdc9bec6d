package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// scrapeGateway GETs the gateway's /metrics and returns each sample's
// value by its name and labels as the text format writes them
// (name{a="b",...}), after checking that the text parses.
func scrapeGateway(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + gateway.MetricsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %s %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := p.TextToMetricFamilies(strings.NewReader(string(b))); err != nil {
		t.Fatalf("not Prometheus text: %v", err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		_ = json.Unmarshal([]byte(line[i+1:]), &v)
		out[line[:i]] = v
	}
	return out
}

// TestGatewayMetrics: bcgw serve --metrics on a bare port listens on
// loopback and serves, in Prometheus text labelled with the gateway's
// name, the session it holds, the join it admitted and the one it
// refused, a command's round trip and the store's latency; without the
// flag nothing listens.
func TestGatewayMetrics(t *testing.T) {
	g := startGateway(t, gateway.Config{Name: "gw-m", MetricsListen: "0"})
	addr := g.s.MetricsAddr()
	if addr == nil || !strings.HasPrefix(addr.String(), "127.0.0.1:") {
		t.Fatalf("metrics address %v, want loopback", addr)
	}
	a := g.join(t)
	cl := g.client(t, nil)
	if _, err := cl.Join(context.Background(), connect.NewRequest(&bcdv1.JoinRequest{Role: "node"})); err == nil {
		t.Fatal("a join without a token was admitted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := g.agentSession(t, ctx, a, &bcdv1.Hello{})
	ac := adminapi.NewClient(g.dir, "", "")
	c, err := ac.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "agent.ping"})
	if err != nil {
		t.Fatal(err)
	}
	for f := recv(t, st); f.GetCommand().GetId() != c.ID; f = recv(t, st) {
	}
	time.Sleep(30 * time.Millisecond)
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: c.ID, Status: "SUCCEEDED", Output: []byte(`{}`)}}})
	waitFor(t, "the result", func() bool { v, _ := ac.Command(ctx, c.ID, 0); return v.State == "done" })

	// The result is visible in the store a moment before it is counted.
	var m map[string]float64
	waitFor(t, "the round trip counted", func() bool {
		m = scrapeGateway(t, addr.String())
		return m[`bcgw_command_round_trip_seconds_count{gateway="gw-m"}`] == 1 && m[`bcgw_store_seconds_count{gateway="gw-m",op="SetResult"}`] == 1
	})
	for _, c := range []struct {
		sample string
		ok     func(float64) bool
	}{
		{`bcgw_sessions{gateway="gw-m"}`, func(v float64) bool { return v == 1 }},
		{`bcgw_database_up{gateway="gw-m"}`, func(v float64) bool { return v == 1 }},
		{`bcgw_joins_total{gateway="gw-m",role="node"}`, func(v float64) bool { return v == 1 }},
		{`bcgw_join_refusals_total{gateway="gw-m",reason="invalid_argument"}`, func(v float64) bool { return v == 1 }},
		{`bcgw_command_round_trip_seconds_count{gateway="gw-m"}`, func(v float64) bool { return v == 1 }},
		{`bcgw_command_round_trip_seconds_bucket{gateway="gw-m",le="0.025"}`, func(v float64) bool { return v == 0 }},
		{`bcgw_command_round_trip_seconds_sum{gateway="gw-m"}`, func(v float64) bool { return v >= 0.03 && v < 10 }},
		{`bcgw_store_seconds_count{gateway="gw-m",op="SetResult"}`, func(v float64) bool { return v == 1 }},
		{`bcgw_store_seconds_count{gateway="gw-m",op="StartSession"}`, func(v float64) bool { return v == 1 }},
		{`bcgw_results_pending_ack{gateway="gw-m"}`, func(v float64) bool { return v == 0 }},
	} {
		v, found := m[c.sample]
		if !found || !c.ok(v) {
			t.Errorf("%s = %v (found %v)", c.sample, v, found)
		}
	}

	plain := startGateway(t, gateway.Config{})
	if plain.s.MetricsAddr() != nil {
		t.Error("a gateway without --metrics listens for scrapes")
	}
}

// TestGatewayProfiles: with Profile the metrics listener serves Go's
// profiles (the blocking one recorded); without it, /debug/pprof/ is not
// there.
func TestGatewayProfiles(t *testing.T) {
	for _, tc := range []struct {
		profile bool
		want    int
	}{{true, http.StatusOK}, {false, http.StatusNotFound}} {
		g := startGateway(t, gateway.Config{MetricsListen: "0", Profile: tc.profile})
		resp, err := http.Get("http://" + g.s.MetricsAddr().String() + "/debug/pprof/block?debug=1")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("profile %v: /debug/pprof/block answers %d, want %d", tc.profile, resp.StatusCode, tc.want)
		}
	}
}
