package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

type agentStream = *connect.BidiStreamForClient[bcdv1.AgentFrame, bcdv1.GatewayFrame]

// joinRole joins a new agent of role (node or site) with a fresh token.
func (g *gw) joinRole(t *testing.T, role string) *identity.Agent {
	t.Helper()
	o := joinOpts(g, g.client(t, nil), g.token(t, role, 1), t.TempDir())
	o.Role = role
	a, err := join.Join(context.Background(), o)
	if err != nil {
		t.Fatalf("join as %s: %v", role, err)
	}
	return a
}

// agentSession opens a Session as agent a with hello (its node id and role
// filled in), checks the first frame is Welcome and waits until the
// gateway registered it.
func (g *gw) agentSession(t *testing.T, ctx context.Context, a *identity.Agent, hello *bcdv1.Hello) agentStream {
	t.Helper()
	_, st := g.welcomeOf(t, ctx, a, hello)
	return st
}

func sendFrame(t *testing.T, st agentStream, f *bcdv1.AgentFrame) {
	t.Helper()
	if err := st.Send(f); err != nil {
		t.Fatal(err)
	}
}

// recv returns the next frame the gateway sends, failing after 5 s.
func recv(t *testing.T, st agentStream) *bcdv1.GatewayFrame {
	t.Helper()
	type res struct {
		f   *bcdv1.GatewayFrame
		err error
	}
	ch := make(chan res, 1)
	go func() {
		f, err := st.Receive()
		ch <- res{f, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("receive: %v", r.err)
		}
		return r.f
	case <-time.After(5 * time.Second):
		t.Fatal("no frame from the gateway within 5s")
		return nil
	}
}

// recvDesired returns the next frame, which must be a DesiredState.
func recvDesired(t *testing.T, st agentStream) *bcdv1.DesiredState {
	t.Helper()
	f := recv(t, st)
	if f.GetDesiredState() == nil {
		t.Fatalf("frame %v, want DesiredState", f)
	}
	return f.GetDesiredState()
}

// noFrameBefore asserts that the gateway sends nothing before it answered
// every frame the agent sent so far: it sends a result for an unknown
// command, which the gateway acks once it handled what came before.
func noFrameBefore(t *testing.T, st agentStream, what string) {
	t.Helper()
	id := "cmd_sentinel_" + what
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: id, Status: "SUCCEEDED"}}})
	f := recv(t, st)
	if ids := f.GetAck().GetResultIds(); len(ids) != 1 || ids[0] != id {
		t.Fatalf("%s: frame %v, want nothing before the sentinel's Ack", what, f)
	}
}

func specOf(t *testing.T, g *gw, node string) (uint64, string) {
	t.Helper()
	gen, b, err := g.s.Spec(node)
	if err != nil {
		t.Fatal(err)
	}
	return gen, string(b)
}

// Setting, patching and reading a node's spec; every refusal stores
// nothing and keeps the generation.
func TestSpecSetPatchGet(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	ctx := context.Background()
	ac := adminapi.NewClient(g.dir, "", "")

	if gen, spec := specOf(t, g, a.NodeID); gen != 0 || spec != "{}" {
		t.Fatalf("a new node's spec: %d %s", gen, spec)
	}
	gen, err := g.s.SetSpec(a.NodeID, []byte(` {"telemetry": {"every": 10},  "host":{"hostname":"h1"}, "daemon": null} `))
	if err != nil || gen != 1 {
		t.Fatalf("first set: %d %v, want generation 1", gen, err)
	}
	const want1 = `{"host":{"hostname":"h1"},"telemetry":{"every":10}}`
	if gen, spec := specOf(t, g, a.NodeID); gen != 1 || spec != want1 {
		t.Fatalf("stored %d %s, want the canonical spec at 1", gen, spec)
	}
	// The same spec again is no change.
	if gen, err := g.s.SetSpec(a.NodeID, []byte(`{"host":{"hostname":"h1"},"telemetry":{"every":10}}`)); err != nil || gen != 1 {
		t.Fatalf("the same spec again: %d %v, want generation 1", gen, err)
	}

	big := `{"host":{"x":"` + strings.Repeat("a", 4<<20) + `"}}`
	refusals := []struct {
		name, node, body, want string
		patch                  bool
	}{
		{"set for an unknown node", "node_nosuch", `{}`, "bcgw nodes", false},
		{"patch for an unknown node", "node_nosuch", `{}`, "bcgw nodes", true},
		{"unknown section", a.NodeID, `{"host":{},"gpus":{}}`, `unknown section "gpus"`, false},
		{"unknown section by patch", a.NodeID, `{"gpus":{}}`, `unknown section "gpus"`, true},
		{"not an object", a.NodeID, `[1]`, "not a JSON object", false},
		{"not JSON", a.NodeID, `{"host":`, "not a JSON object", false},
		{"trailing data", a.NodeID, `{} {}`, "after its JSON object", false},
		{"over 4 MiB", a.NodeID, big, "at most", false},
		{"patch over 4 MiB", a.NodeID, big, "at most", true},
		{"patch that is an array", a.NodeID, `[{"op":"add"}]`, "not a JSON object", true},
		{"patch that is null", a.NodeID, `null`, "not a JSON object", true},
		{"patch that is a string", a.NodeID, `"host"`, "not a JSON object", true},
		{"patch that is not JSON", a.NodeID, `{"host":`, "not a JSON object", true},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			for _, via := range []string{"server", "admin"} {
				var err error
				switch {
				case via == "server" && tt.patch:
					_, err = g.s.PatchSpec(tt.node, []byte(tt.body))
				case via == "server":
					_, err = g.s.SetSpec(tt.node, []byte(tt.body))
				case tt.patch:
					_, err = ac.PatchSpec(ctx, tt.node, []byte(tt.body))
				default:
					_, err = ac.SetSpec(ctx, tt.node, []byte(tt.body))
				}
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s: %v, want an error with %q", via, err, tt.want)
				}
				if err != nil && tt.node == a.NodeID && !strings.Contains(err.Error(), "nothing stored") {
					t.Errorf("%s: %v does not say nothing was stored", via, err)
				}
			}
			if gen, spec := specOf(t, g, a.NodeID); gen != 1 || spec != want1 {
				t.Fatalf("after the refusal: %d %s, want %s at 1", gen, spec, want1)
			}
		})
	}
	if _, _, err := g.s.Spec("node_nosuch"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("spec of an unknown node: %v", err)
	}
	if _, err := ac.Spec(ctx, "node_nosuch"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("admin spec of an unknown node: %v", err)
	}

	// A patch merges (RFC 7396: null removes) and is the next generation;
	// through the admin API too.
	if gen, err := g.s.PatchSpec(a.NodeID, []byte(`{"host":{"hostname":null,"tz":"UTC"},"telemetry":null}`)); err != nil || gen != 2 {
		t.Fatalf("patch: %d %v", gen, err)
	}
	if gen, spec := specOf(t, g, a.NodeID); gen != 2 || spec != `{"host":{"tz":"UTC"}}` {
		t.Fatalf("after the patch: %d %s", gen, spec)
	}
	if gen, err := ac.PatchSpec(ctx, a.NodeID, []byte(`{"access":{"users":[]}}`)); err != nil || gen != 3 {
		t.Fatalf("admin patch: %d %v", gen, err)
	}
	if gen, err := ac.SetSpec(ctx, a.NodeID, []byte(`{"daemon":{"log_level":"debug"}}`)); err != nil || gen != 4 {
		t.Fatalf("admin set: %d %v", gen, err)
	}
	v, err := ac.Spec(ctx, a.NodeID)
	if err != nil || v.Generation != 4 || string(v.Spec) != `{"daemon":{"log_level":"debug"}}` {
		t.Fatalf("admin get: %+v %v", v, err)
	}
	// A spec written under a generation that moved is refused by the store.
	if _, err := g.s.Store().PutSpec(a.NodeID, 3, []byte(`{}`), time.Now()); !errors.Is(err, store.ErrGenerationMoved) {
		t.Errorf("put on a stale generation: %v", err)
	}
}

// After Welcome (and the pending commands), an agent that holds another
// generation than the stored one gets the spec in full; one at the stored
// generation gets nothing. Changes on a live session come as a patch on
// the previous generation, or in full for a set.
func TestSpecSentAfterWelcome(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	if _, err := g.s.SetSpec(a.NodeID, []byte(`{"host":{"hostname":"h1"}}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.s.PatchSpec(a.NodeID, []byte(`{"telemetry":{"every":5}}`)); err != nil {
		t.Fatal(err)
	}
	gen, spec := specOf(t, g, a.NodeID)
	tests := []struct {
		name    string
		applied uint64
		full    bool
	}{
		{"holds nothing", 0, true},
		{"holds an older generation", 1, true},
		{"holds a generation the gateway never made", 7, true},
		{"holds the current generation", gen, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, err := g.s.SendCommand(a.NodeID, "agent.ping", nil, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st := g.agentSession(t, ctx, a, &bcdv1.Hello{AppliedGeneration: tt.applied})
			if f := recv(t, st); f.GetCommand().GetId() != cmd.ID {
				t.Fatalf("after Welcome %v, want the pending command", f)
			}
			sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: cmd.ID, Status: "SUCCEEDED"}}})
			if tt.full {
				ds := recvDesired(t, st)
				if ds.GetPatch() || ds.GetGeneration() != gen || string(ds.GetSpec()) != spec || ds.GetBaseGeneration() != 0 {
					t.Fatalf("desired state %v, want the full spec at %d", ds, gen)
				}
			}
			if f := recv(t, st); len(f.GetAck().GetResultIds()) != 1 {
				t.Fatalf("frame %v, want the result's Ack", f)
			}
			noFrameBefore(t, st, "welcome")
			n, _ := g.s.Store().Node(a.NodeID)
			if n.AppliedGeneration != tt.applied {
				t.Errorf("stored applied generation %d, want %d from Hello", n.AppliedGeneration, tt.applied)
			}
			_ = st.CloseRequest()
			waitFor(t, "the session to end", func() bool { return !g.s.Connected(a.NodeID) })
		})
	}

	// A live session: a patch goes with the generation it applies on, a
	// set in full, a change to nothing is not sent.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := g.agentSession(t, ctx, a, &bcdv1.Hello{AppliedGeneration: gen})
	// Past the Welcome's spec step (a change before it would be sent in
	// full then), and nothing was sent.
	noFrameBefore(t, st, "current generation")
	if _, err := g.s.PatchSpec(a.NodeID, []byte(`{"host":{"tz":"UTC"}}`)); err != nil {
		t.Fatal(err)
	}
	ds := recvDesired(t, st)
	if !ds.GetPatch() || ds.GetGeneration() != gen+1 || ds.GetBaseGeneration() != gen || string(ds.GetSpec()) != `{"host":{"tz":"UTC"}}` {
		t.Fatalf("patch frame %v, want generation %d on %d", ds, gen+1, gen)
	}
	if _, err := g.s.SetSpec(a.NodeID, []byte(`{"daemon":{}}`)); err != nil {
		t.Fatal(err)
	}
	ds = recvDesired(t, st)
	if ds.GetPatch() || ds.GetGeneration() != gen+2 || string(ds.GetSpec()) != `{"daemon":{}}` {
		t.Fatalf("set frame %v, want the full spec at %d", ds, gen+2)
	}
	if g2, err := g.s.PatchSpec(a.NodeID, []byte(`{"daemon":{}}`)); err != nil || g2 != gen+2 {
		t.Fatalf("a patch that changes nothing: %d %v", g2, err)
	}
	noFrameBefore(t, st, "no change")

	// want_full_spec gets the full spec once per report; not again for a
	// refusal of the very generation this session sent in full.
	cur := gen + 2
	for i, tt := range []struct {
		refused uint64
		sent    bool
	}{{cur - 1, true}, {cur, false}, {0, true}} {
		sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: &bcdv1.StatusReport{
			WantFullSpec: true, RefusedGeneration: tt.refused, SpecError: "cannot apply", AppliedGeneration: cur - 2,
		}}})
		if tt.sent {
			ds := recvDesired(t, st)
			if ds.GetPatch() || ds.GetGeneration() != cur || string(ds.GetSpec()) != `{"daemon":{}}` {
				t.Fatalf("report %d: %v, want the full spec at %d", i, ds, cur)
			}
		}
		noFrameBefore(t, st, "want full spec")
	}
	v, err := g.s.Status(a.NodeID)
	if err != nil || v.SpecError != "cannot apply" || v.SpecGeneration != cur || v.AppliedGeneration != cur-2 || !v.Connected {
		t.Fatalf("status %+v %v", v, err)
	}
}

// Events are stored once per seq, acked each time, and listed oldest
// first; a body too large is not kept.
func TestEventsStoredOncePerSeq(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := g.agentSession(t, ctx, a, &bcdv1.Hello{})
	at := time.Now().Add(-time.Minute).UnixMilli()
	for _, e := range []*bcdv1.Event{
		{Seq: 2, Type: "xid", Body: []byte(`{"gpu":0,"xid":79}`), AtUnixMs: at},
		{Seq: 1, Type: "boot", Body: []byte(`plain text`), AtUnixMs: at},
		{Seq: 2, Type: "xid", Body: []byte(`{"copy":true}`), AtUnixMs: at},
		{Seq: 3, Type: "big", Body: bytes.Repeat([]byte("x"), fleet.MaxEventBody+1), AtUnixMs: at},
	} {
		sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Event{Event: e}})
		if f := recv(t, st); f.GetAck().GetEventSeq() != e.GetSeq() {
			t.Fatalf("after event %d: %v, want Ack{event_seq: %d}", e.GetSeq(), f, e.GetSeq())
		}
	}
	ac := adminapi.NewClient(g.dir, "", "")
	evs, err := ac.Events(ctx, a.NodeID, 0)
	if err != nil || len(evs) != 3 {
		t.Fatalf("events %+v %v, want 3", evs, err)
	}
	if evs[0].Seq != 1 || string(evs[0].Body) != `"plain text"` || evs[0].Type != "boot" || evs[0].At.UnixMilli() != at {
		t.Errorf("event 1 %+v", evs[0])
	}
	if evs[1].Seq != 2 || string(evs[1].Body) != `{"gpu":0,"xid":79}` {
		t.Errorf("event 2 %+v, want the first copy", evs[1])
	}
	if evs[2].Seq != 3 || evs[2].Body != nil || evs[2].BodyDropped != fleet.MaxEventBody+1 {
		t.Errorf("event 3 %+v, want its body dropped", evs[2])
	}
	if evs, err := ac.Events(ctx, a.NodeID, 2); err != nil || len(evs) != 1 || evs[0].Seq != 3 {
		t.Errorf("events after 2: %+v %v", evs, err)
	}
	if _, err := ac.Events(ctx, "node_nosuch", 0); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("events of an unknown node: %v", err)
	}
}

// Heartbeats keep the generations and, when they carry any, the inventory
// hashes; a StatusReport is kept whole (but not one over 1 MiB) and shows
// in the status view.
func TestHeartbeatAndStatusReportStored(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := g.agentSession(t, ctx, a, &bcdv1.Hello{AppliedGeneration: 0})
	ac := adminapi.NewClient(g.dir, "", "")
	status := func() adminapi.StatusView {
		t.Helper()
		v, err := ac.Status(ctx, a.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := status(); !v.Connected || v.ReportAt != nil || v.Sections == nil || v.Conditions == nil {
		t.Fatalf("status before any report: %+v", v)
	}
	hashes := map[string]string{"cpu": "sha256:aa", "gpus": "sha256:bb"}
	for _, hb := range []*bcdv1.Heartbeat{
		{AppliedGeneration: 3, ObservedGeneration: 2, InventoryHashes: hashes},
		{AppliedGeneration: 4, ObservedGeneration: 4},
	} {
		sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Heartbeat{Heartbeat: hb}})
	}
	noFrameBefore(t, st, "heartbeats")
	v := status()
	if v.AppliedGeneration != 4 || v.ObservedGeneration != 4 || len(v.InventoryHashes) != 2 || v.InventoryHashes["gpus"] != "sha256:bb" || v.InventoryHashesAt == nil {
		t.Fatalf("after heartbeats: %+v", v)
	}

	report := &bcdv1.StatusReport{
		ObservedGeneration: 4, AppliedGeneration: 4,
		Sections: []byte(`{"images":[{"digest":"d1","state":"READY"}],"site":{"cache_images":"READY"}}`),
		SectionStates: []*bcdv1.SectionStatus{
			{Name: "host", State: "CONVERGED", Generation: 4},
			{Name: "devices", State: "RETRYING", Generation: 4, Message: "nvidia-smi failed", Changes: []string{"load nvidia"}, Attempts: 2},
		},
		Conditions: []*bcdv1.Condition{{Type: "GpuXid", Subject: "gpu0", Reason: "79", Count: 3, SinceUnixMs: 1}},
		Pressure:   &bcdv1.Pressure{Available: true, CpuSomeAvg10: 1.5},
		Inventory:  []byte(`{"cpu":{"cores":8},"gpus":[]}`), InventoryHashes: map[string]string{"cpu": "sha256:cc"},
		AtUnixMs: time.Now().UnixMilli(),
	}
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: report}})
	// A later report with one inventory section changed keeps the others.
	second := &bcdv1.StatusReport{ObservedGeneration: 4, AppliedGeneration: 4, Sections: report.Sections, SectionStates: report.SectionStates,
		Conditions: report.Conditions, Pressure: report.Pressure, Inventory: []byte(`{"gpus":[{"index":0}]}`)}
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: second}})
	// One over 1 MiB is refused with a log line; the last one stays.
	huge := &bcdv1.StatusReport{Sections: []byte(`{"x":"` + strings.Repeat("a", fleet.MaxStatusReport) + `"}`)}
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: huge}})
	noFrameBefore(t, st, "reports")
	if !strings.Contains(g.logs.String(), "status report refused") {
		t.Error("no log line for the report over 1 MiB")
	}
	v = status()
	if v.ReportAt == nil || len(v.Sections) != 2 || v.Sections[1].State != "RETRYING" || v.Sections[1].Changes[0] != "load nvidia" ||
		len(v.Conditions) != 1 || v.Conditions[0].Count != 3 || v.Pressure == nil || v.Pressure.CPUSomeAvg10 != 1.5 {
		t.Fatalf("status after reports: %+v", v)
	}
	var rep struct {
		Site struct {
			CacheImages string `json:"cache_images"`
		} `json:"site"`
	}
	if json.Unmarshal(v.Report, &rep) != nil || rep.Site.CacheImages != "READY" {
		t.Errorf("role report %s", v.Report)
	}
	if string(v.Inventory) != `{"cpu":{"cores":8},"gpus":[{"index":0}]}` {
		t.Errorf("inventory %s, want cpu kept and gpus replaced", v.Inventory)
	}
	if v.InventoryHashes["cpu"] != "sha256:cc" {
		t.Errorf("inventory hashes %v, want the report's (newer than the heartbeat's)", v.InventoryHashes)
	}
	if _, err := ac.Status(ctx, "node_nosuch"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("status of an unknown node: %v", err)
	}
}

// heldSpec is an agent's spec as the agent holds it: what the next
// DesiredState's signature covers the sections of.
type heldSpec struct{ raw []byte }

// full merges ds onto the held spec as the agent does and returns the
// full spec it makes, now held.
func (h *heldSpec) full(t *testing.T, ds *bcdv1.DesiredState) nodespec.Spec {
	t.Helper()
	var s nodespec.Spec
	var err error
	if ds.GetPatch() {
		s, err = nodespec.Merge(h.raw, ds.GetSpec())
	} else {
		s, err = nodespec.Decode(ds.GetSpec())
	}
	if err != nil {
		t.Fatalf("desired state %d: %v", ds.GetGeneration(), err)
	}
	h.raw = s.Encode()
	return s
}
