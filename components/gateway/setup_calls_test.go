package gateway_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// storeCalls are the store calls of a gateway counted so far, by
// operation (bcgw_store_seconds_count).
func storeCalls(t *testing.T, g *gw) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, v := range scrapeGateway(t, g.s.MetricsAddr().String()) {
		if _, rest, ok := strings.Cut(k, `bcgw_store_seconds_count{`); ok {
			_, op, _ := strings.Cut(rest, `op="`)
			out[strings.TrimSuffix(op, `"}`)] = v
		}
	}
	return out
}

// TestReconnectStoreCalls: an agent that reconnects and sends again the
// report and the heartbeat it sent before costs its gateway three store
// calls (its node record, the session's start, and one read of its
// report, commands and spec together): no report read or written, no
// heartbeat written. A report that changed is stored.
func TestReconnectStoreCalls(t *testing.T) {
	g := startGateway(t, gateway.Config{Name: "gw-c", MetricsListen: "0"})
	a := g.join(t)
	ac := adminapi.NewClient(g.dir, "", "")
	report := func(at int64) *bcdv1.StatusReport {
		return &bcdv1.StatusReport{AtUnixMs: at, AppliedGeneration: 0, Sections: []byte(`{"gpus":[]}`),
			Inventory: []byte(`{"cpu":{"cores":8}}`), InventoryHashes: map[string]string{"cpu": "sha256:aa"},
			Pressure: &bcdv1.Pressure{Available: true, CpuSomeAvg10: 1.5, AtUnixMs: at}}
	}
	hello := func() *bcdv1.Hello { return &bcdv1.Hello{Version: "v1", LastAckedEvent: 0} }
	beat := &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Heartbeat{Heartbeat: &bcdv1.Heartbeat{InventoryHashes: map[string]string{"cpu": "sha256:aa"}}}}

	ctx1, cancel1 := context.WithCancel(context.Background())
	st := g.agentSession(t, ctx1, a, hello())
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: report(1234)}})
	sendFrame(t, st, beat)
	noFrameBefore(t, st, "first")
	first, err := ac.Status(context.Background(), a.NodeID)
	if err != nil || first.ReportAt == nil {
		t.Fatalf("first report not stored: %v %+v", err, first)
	}
	cancel1()
	_ = st.CloseRequest()
	_ = st.CloseResponse()
	waitFor(t, "the first session to end", func() bool { return !g.s.Connected(a.NodeID) })

	before := storeCalls(t, g)
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	w, st := g.welcomeOf(t, ctx2, a, hello())
	if len(w.GetRequestedSections()) != 0 {
		t.Errorf("Welcome asks for %v of an inventory the gateway holds", w.GetRequestedSections())
	}
	// The agent builds its report again for the Welcome: only its times
	// differ.
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: report(5678)}})
	sendFrame(t, st, beat)
	noFrameBefore(t, st, "again") // one SetResult of an unknown command
	after := storeCalls(t, g)
	calls := map[string]float64{}
	total := 0.0
	for op, v := range after {
		if d := v - before[op]; d > 0 && op != "SetResult" {
			calls[op] = d
			total += d
		}
	}
	if total > 3 || calls["PutReport"] != 0 || calls["Report"] != 0 || calls["UpdateNode"] != 0 {
		t.Errorf("a reconnect with the same report and heartbeat made %v store calls: %v; want at most 3 (Node, StartSession, SessionState), no report read or written, no heartbeat written", total, calls)
	}
	again, _ := ac.Status(context.Background(), a.NodeID)
	if again.ReportAt == nil || !again.ReportAt.Equal(*first.ReportAt) || string(again.Report) != string(first.Report) {
		t.Errorf("the same report re-sent changed the stored one: at %v (was %v), %s (was %s)", again.ReportAt, first.ReportAt, again.Report, first.Report)
	}

	// A report whose pressure changed is stored, and so is one whose
	// sections changed.
	changed := report(6000)
	changed.Pressure.CpuSomeAvg10 = 2.5
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: changed}})
	noFrameBefore(t, st, "pressure")
	if v, _ := ac.Status(context.Background(), a.NodeID); v.Pressure == nil || v.Pressure.CPUSomeAvg10 != 2.5 || !v.ReportAt.After(*first.ReportAt) {
		t.Errorf("report with other pressure: %+v at %v, want it stored", v.Pressure, v.ReportAt)
	}
	changed = &bcdv1.StatusReport{AtUnixMs: 7000, Sections: []byte(`{"gpus":[1]}`)}
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: changed}})
	noFrameBefore(t, st, "changed")
	if v, _ := ac.Status(context.Background(), a.NodeID); string(v.Report) != `{"gpus":[1]}` {
		t.Errorf("changed report: %s, want it stored", v.Report)
	}
	if v, _ := ac.Status(context.Background(), a.NodeID); string(v.Inventory) != `{"cpu":{"cores":8}}` {
		t.Errorf("inventory after a report without it: %s, want the kept section", v.Inventory)
	}
}
