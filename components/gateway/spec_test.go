package gateway_test

import (
	"bytes"
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/protobuf/proto"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/boot/bootlease"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/agentsvc"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/seal"
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

// leaseOf decodes site.boot_lease of a spec.
func leaseOf(t *testing.T, spec []byte) (bootlease.BootLease, bool) {
	t.Helper()
	var s struct {
		Site *struct {
			BootLease *bootlease.BootLease `json:"boot_lease"`
		} `json:"site"`
	}
	if err := json.Unmarshal(spec, &s); err != nil {
		t.Fatalf("spec %s: %v", spec, err)
	}
	if s.Site == nil || s.Site.BootLease == nil {
		return bootlease.BootLease{}, false
	}
	return *s.Site.BootLease, true
}

// A site's boot lease is site.boot_lease of its agents' desired specs: the
// holder's grant and every renewal are new generations sent as patches on
// the previous one, another agent of the site is told it does not hold
// it, cache_images travel the same way, an operator's spec keeps the
// gateway's lease, and a restarted gateway keeps a running lease where it
// was.
func TestSiteLeaseFlowsAsSpec(t *testing.T) {
	ttl := time.Minute
	g := startGateway(t, gateway.Config{LeaseTTL: ttl})
	a, b := g.joinRole(t, "site"), g.joinRole(t, "site")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sta := g.agentSession(t, ctx, a, &bcdv1.Hello{})
	ds := recvDesired(t, sta)
	l, ok := leaseOf(t, ds.GetSpec())
	if !ds.GetPatch() || ds.GetGeneration() != 1 || ds.GetBaseGeneration() != 0 || !ok || !l.Held {
		t.Fatalf("a's first frame %v, want the lease as a patch to generation 1", ds)
	}
	if left := time.Until(time.UnixMilli(l.ExpiresUnixMS)); left < ttl-5*time.Second || left > ttl {
		t.Errorf("lease expires in %v, want about %v", left, ttl)
	}
	if gen, spec := specOf(t, g, a.NodeID); gen != 1 || spec != string(ds.GetSpec()) {
		t.Errorf("a's stored spec %d %s", gen, spec)
	}
	// A renewal with each heartbeat: the next generation.
	time.Sleep(2 * time.Millisecond) // a later expiry, to the millisecond
	sendFrame(t, sta, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Heartbeat{Heartbeat: &bcdv1.Heartbeat{}}})
	ds = recvDesired(t, sta)
	if l2, _ := leaseOf(t, ds.GetSpec()); !ds.GetPatch() || ds.GetGeneration() != 2 || ds.GetBaseGeneration() != 1 || !l2.Held || l2.ExpiresUnixMS < l.ExpiresUnixMS {
		t.Fatalf("renewal %v", ds)
	}
	// cache_images are a patch of the same spec.
	img := adminapi.CacheImage{SHA256: strings.Repeat("a", 64), URL: "https://images.example/x"}
	if err := g.s.SetCacheImages(a.NodeID, []adminapi.CacheImage{img}); err != nil {
		t.Fatal(err)
	}
	ds = recvDesired(t, sta)
	if !ds.GetPatch() || ds.GetGeneration() != 3 || ds.GetBaseGeneration() != 2 ||
		string(ds.GetSpec()) != `{"site":{"cache_images":[{"sha256":"`+img.SHA256+`","url":"`+img.URL+`"}]}}` {
		t.Fatalf("cache_images frame %v", ds)
	}
	if err := g.s.SetCacheImages(b.NodeID, nil); err != nil {
		t.Fatal(err)
	}
	nodeAgent := g.join(t)
	if err := g.s.SetCacheImages(nodeAgent.NodeID, nil); err == nil || !strings.Contains(err.Error(), "not a site agent") {
		t.Errorf("cache_images for a node agent: %v", err)
	}

	// b, of the same site: it holds its cache_images (generation 1), and
	// gets them in full after Welcome, then is told it has no lease.
	stb := g.agentSession(t, ctx, b, &bcdv1.Hello{})
	ds = recvDesired(t, stb)
	if ds.GetPatch() || ds.GetGeneration() != 1 || string(ds.GetSpec()) != `{"site":{"cache_images":[]}}` {
		t.Fatalf("b's full spec %v", ds)
	}
	ds = recvDesired(t, stb)
	if l, ok := leaseOf(t, ds.GetSpec()); !ds.GetPatch() || ds.GetGeneration() != 2 || ds.GetBaseGeneration() != 1 || !ok || l.Held {
		t.Fatalf("b's lease frame %v, want held false", ds)
	}
	// Its heartbeats change nothing while it does not hold the lease.
	sendFrame(t, stb, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Heartbeat{Heartbeat: &bcdv1.Heartbeat{}}})
	noFrameBefore(t, stb, "b's heartbeat")
	if gen, _ := specOf(t, g, b.NodeID); gen != 2 {
		t.Errorf("b's generation %d after a heartbeat without the lease, want 2", gen)
	}

	// An operator's spec keeps the gateway's lease, whatever it says of it.
	_, before := specOf(t, g, a.NodeID)
	held, _ := leaseOf(t, []byte(before))
	for _, spec := range []string{
		`{"site":{"boot_lease":{"held":false},"bmc_networks":["10.0.0.0/24"]},"daemon":{}}`,
		`{"daemon":{"x":1}}`,
	} {
		gen, err := g.s.SetSpec(a.NodeID, []byte(spec))
		if err != nil {
			t.Fatal(err)
		}
		ds = recvDesired(t, sta)
		if ds.GetPatch() || ds.GetGeneration() != gen {
			t.Fatalf("set frame %v, want the full spec at %d", ds, gen)
		}
		if l, ok := leaseOf(t, ds.GetSpec()); !ok || l != held {
			t.Fatalf("after an operator's spec %s the lease is %+v (%v), want %+v kept", spec, l, ok, held)
		}
	}
	_, after := specOf(t, g, a.NodeID)
	var got map[string]map[string]any
	if err := json.Unmarshal([]byte(after), &got); err != nil || len(got) != 2 || got["daemon"]["x"] != 1.0 || len(got["site"]) != 1 {
		t.Errorf("a's spec after an operator's set %s, want daemon and the lease only", after)
	}
	// Nor can an operator grant b the lease, by set or by patch.
	if _, err := g.s.SetSpec(b.NodeID, []byte(`{"site":{"boot_lease":{"held":true,"expires_unix_ms":99999999999999}}}`)); err != nil {
		t.Fatal(err)
	}
	if l, _ := leaseOf(t, recvDesired(t, stb).GetSpec()); l.Held {
		t.Fatal("an operator's spec granted b the lease")
	}
	genB, specB := specOf(t, g, b.NodeID)
	for _, p := range []string{`{"site":{"boot_lease":{"held":true}}}`, `{"site":{"boot_lease":null}}`, `{"site":null}`, `{"site":"x"}`} {
		if _, err := g.s.PatchSpec(b.NodeID, []byte(p)); err == nil || !strings.Contains(err.Error(), "gateway") {
			t.Errorf("patch %s: %v, want a refusal naming the gateway's lease", p, err)
		}
	}
	if _, err := g.s.SetSpec(b.NodeID, []byte(`{"site":["x"]}`)); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("a site section that is not an object: %v", err)
	}
	if gen, spec := specOf(t, g, b.NodeID); gen != genB || spec != specB {
		t.Errorf("b's spec changed by refused patches: %d %s", gen, spec)
	}
	noFrameBefore(t, stb, "refused patches")

	// A restarted gateway: a's lease still runs, so b does not get it; a,
	// holding the current generation, gets no full spec, only the renewal.
	genA, _ := specOf(t, g, a.NodeID)
	_ = sta.CloseRequest()
	_ = stb.CloseRequest()
	cancel()
	if err := g.stop(true); err != nil {
		t.Fatal(err)
	}
	g = startGateway(t, gateway.Config{DataDir: g.dir, LeaseTTL: ttl})
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	stb = g.agentSession(t, ctx2, b, &bcdv1.Hello{AppliedGeneration: genB})
	sendFrame(t, stb, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Heartbeat{Heartbeat: &bcdv1.Heartbeat{}}})
	noFrameBefore(t, stb, "b after the restart")
	sta = g.agentSession(t, ctx2, a, &bcdv1.Hello{AppliedGeneration: genA})
	ds = recvDesired(t, sta)
	if l, _ := leaseOf(t, ds.GetSpec()); !ds.GetPatch() || ds.GetBaseGeneration() != genA || !l.Held {
		t.Fatalf("a after the restart: %v, want a renewal on %d", ds, genA)
	}
	nodes, _ := adminapi.NewClient(g.dir, "", "").Nodes(ctx2)
	for _, n := range nodes {
		if n.BootLease != (n.ID == a.NodeID) {
			t.Errorf("node %s boot_lease %v", n.ID, n.BootLease)
		}
	}
}

// A lease whose holder is gone goes, once it lapsed, to another connected
// agent of the site, as a new generation of that agent's spec.
func TestSiteLeaseHandedOn(t *testing.T) {
	g := startGateway(t, gateway.Config{LeaseTTL: 300 * time.Millisecond})
	a, b := g.joinRole(t, "site"), g.joinRole(t, "site")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	actx, acancel := context.WithCancel(ctx)
	sta := g.agentSession(t, actx, a, &bcdv1.Hello{})
	if l, _ := leaseOf(t, recvDesired(t, sta).GetSpec()); !l.Held {
		t.Fatal("a does not hold the lease")
	}
	stb := g.agentSession(t, ctx, b, &bcdv1.Hello{})
	if l, _ := leaseOf(t, recvDesired(t, stb).GetSpec()); l.Held {
		t.Fatal("b holds the lease too")
	}
	acancel()
	_ = sta.CloseRequest()
	_ = sta.CloseResponse()
	waitFor(t, "a's session to end", func() bool { return !g.s.Connected(a.NodeID) })
	ds := recvDesired(t, stb)
	if l, _ := leaseOf(t, ds.GetSpec()); !l.Held || ds.GetGeneration() != 2 || ds.GetBaseGeneration() != 1 {
		t.Fatalf("b after a left: %v, want the lease at generation 2", ds)
	}
}

// A data directory of a gateway from before the desired spec: a site's
// cache_images kept in meta move into its spec (generation 1), the old
// status meta goes.
func TestUpgradeMovesCacheImagesIntoSpec(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(dir + "/bcgw.db")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []store.Node{{ID: "node_site1", Role: "site", Site: "lab"}, {ID: "node_site2", Role: "site", Site: "lab"}} {
		if err := st.PutNode(n); err != nil {
			t.Fatal(err)
		}
	}
	img := `[{"sha256":"` + strings.Repeat("b", 64) + `","url":"https://x/y"}]`
	for k, v := range map[string]string{
		"cacheimages/node_site1": img,
		"cacheimages/node_gone":  img,
		"status/node_site1":      `{"images":[]}`,
	} {
		if err := st.SetMeta(k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()

	g := startGateway(t, gateway.Config{DataDir: dir})
	if gen, spec := specOf(t, g, "node_site1"); gen != 1 || spec != `{"site":{"cache_images":`+img+`}}` {
		t.Errorf("site1's spec %d %s", gen, spec)
	}
	if gen, _ := specOf(t, g, "node_site2"); gen != 0 {
		t.Errorf("site2 got a spec: %d", gen)
	}
	for _, k := range []string{"cacheimages/node_site1", "cacheimages/node_gone", "status/node_site1"} {
		if v, _ := g.s.Store().Meta(k); v != nil {
			t.Errorf("%s still stored: %s", k, v)
		}
	}
	if !strings.Contains(g.logs.String(), "not moved into the spec") {
		t.Error("no log line for the cache_images of an unknown node")
	}
}

// welcomeOf opens a session as a with hello (its node id and role filled
// in) and returns its Welcome, once the gateway registered the session.
func (g *gw) welcomeOf(t *testing.T, ctx context.Context, a *identity.Agent, hello *bcdv1.Hello) (*bcdv1.Welcome, agentStream) {
	t.Helper()
	st := g.client(t, certOf(a)).Session(ctx)
	t.Cleanup(func() {
		_ = st.CloseRequest()
		_ = st.CloseResponse()
	})
	hello.NodeId, hello.Role, hello.BootId = a.NodeID, a.Role, "boot"
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Hello{Hello: hello}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	f, err := st.Receive()
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("first frame %v %v, want Welcome", f, err)
	}
	waitFor(t, "the session to register", func() bool { return g.s.Connected(a.NodeID) })
	return f.GetWelcome(), st
}

// TestWelcomeRequestsMissingInventory: a gateway that holds none of a
// node's inventory asks for all of it; once a report carried the
// sections, it asks only for those whose hash it knows without content.
func TestWelcomeRequestsMissingInventory(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	w, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	if got := w.GetRequestedSections(); len(got) != 1 || got[0] != "*" {
		t.Fatalf("first Welcome requests %v, want [*]", got)
	}
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: &bcdv1.StatusReport{
		Inventory:       []byte(`{"cpu":{"cores":8}}`),
		InventoryHashes: map[string]string{"cpu": "sha256:aa", "gpus": "sha256:bb"},
	}}})
	ac := adminapi.NewClient(g.dir, "", "")
	waitFor(t, "the report", func() bool { v, _ := ac.Status(ctx, a.NodeID); return v.ReportAt != nil })
	defer cancel()
	// A new session replaces the first.
	w, _ = g.welcomeOf(t, context.Background(), a, &bcdv1.Hello{})
	if got := w.GetRequestedSections(); len(got) != 1 || got[0] != "gpus" {
		t.Errorf("second Welcome requests %v, want [gpus]", got)
	}
}

// TestResultAttestation: bcgw keeps a result's attestation only when it
// verifies under the node's certificate for that command.
func TestResultAttestation(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ac := adminapi.NewClient(g.dir, "", "")
	st := g.agentSession(t, ctx, a, &bcdv1.Hello{})
	var ids []string
	for range 2 {
		c, err := ac.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "gpu.reset", Body: json.RawMessage(`{"gpu":"0"}`)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	other, _ := pki.GenerateKey()
	for i, id := range ids {
		r := &bcdv1.CommandResult{CommandId: id, Status: "SUCCEEDED", Output: []byte(`{"healthy":true}`), StartedUnixMs: 1, FinishedUnixMs: 2}
		k := a.Key
		if i == 1 {
			k = other // not the node's key
		}
		r.Attestation, _ = intent.AttestResult(k, a.NodeID, "gpu.reset", r)
		sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: r}})
	}
	for i, id := range ids {
		var v adminapi.CommandView
		waitFor(t, "the result", func() bool { v, _ = ac.Command(ctx, id, 0); return v.State == "done" })
		if v.Attested != (i == 0) {
			t.Errorf("result %d: attested %v", i, v.Attested)
		}
	}
}

// TestSecretsTravelSealed reads the frames bcgw sends: a discovery token
// asked for by a site agent's running boot.prepareRamdisk crosses the
// session only sealed to the request's reply key (no frame holds it in
// clear); a request not signed by the node key gets nothing.
func TestSecretsTravelSealed(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	site := g.joinRole(t, "site")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ac := adminapi.NewClient(g.dir, "", "")
	st := g.agentSession(t, ctx, site, &bcdv1.Hello{})
	c, err := ac.Send(ctx, adminapi.CommandRequest{Node: site.NodeID, Kind: "boot.prepareRamdisk",
		Body: json.RawMessage(`{"mac":"52:54:00:12:34:56","kernel":{"sha256":"` + strings.Repeat("a", 64) + `","url":"https://x/k"},"initrd":{"sha256":"` + strings.Repeat("b", 64) + `","url":"https://x/i"}}`)})
	if err != nil {
		t.Fatal(err)
	}
	var seen [][]byte
	next := func(want func(*bcdv1.GatewayFrame) bool) *bcdv1.GatewayFrame {
		for {
			f := recv(t, st)
			b, _ := proto.Marshal(f)
			seen = append(seen, b)
			if want(f) {
				return f
			}
		}
	}
	ask := func(id string, signer crypto.Signer) (*seal.Opener, *bcdv1.SecretAnswer) {
		req := &bcdv1.SecretRequest{RequestId: id, Name: fleet.SecretDiscoveryToken, WorkflowId: c.ID, CommandId: c.ID}
		o, err := seal.NewRequest(signer, site.NodeID, req, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_SecretRequest{SecretRequest: req}})
		f := next(func(f *bcdv1.GatewayFrame) bool { return f.GetSecretAnswer().GetRequestId() == id })
		return o, f.GetSecretAnswer()
	}
	o, ans := ask("sec-1", site.Key)
	if ans.GetError() != "" || len(ans.GetValue()) != 0 || ans.GetSealed() == "" {
		t.Fatalf("answer %+v", ans)
	}
	tok, err := o.Open(ans, time.Now())
	if err != nil || !strings.HasPrefix(string(tok), "bcjt_") {
		t.Fatalf("the sealed token: %q %v", tok, err)
	}
	for _, b := range seen {
		if bytes.Contains(b, tok) {
			t.Fatal("a frame bcgw sent holds the discovery token in clear")
		}
	}
	other, _ := pki.GenerateKey()
	if _, ans := ask("sec-2", other); ans.GetError() == "" || ans.GetSealed() != "" {
		t.Errorf("a request signed by another key: %+v", ans)
	}
}

// TestWorkloadTokenSealed: a node's signed request gets a JWT for the
// audience, signed by bcgw's workload key, only sealed to the request's
// reply key; a request signed by another key or for a bad audience gets
// nothing.
func TestWorkloadTokenSealed(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := g.agentSession(t, ctx, a, &bcdv1.Hello{})
	ask := func(id, audience string, signer crypto.Signer) (*seal.Opener, *bcdv1.WorkloadTokenAnswer, []byte) {
		req := &bcdv1.WorkloadTokenRequest{RequestId: id, Audience: audience}
		o, err := seal.NewWorkloadRequest(signer, a.NodeID, req, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_WorkloadTokenRequest{WorkloadTokenRequest: req}})
		for {
			f := recv(t, st)
			if w := f.GetWorkloadTokenAnswer(); w != nil && w.GetRequestId() == id {
				b, _ := proto.Marshal(f)
				return o, w, b
			}
		}
	}
	o, ans, frame := ask("wt-1", "https://vault.example", a.Key)
	if ans.GetError() != "" || ans.GetToken() != "" {
		t.Fatalf("answer %+v", ans)
	}
	raw, err := o.OpenSealed(ans.GetSealed(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(frame, raw) {
		t.Fatal("the frame holds the token in clear")
	}
	tok, err := josejwt.ParseSigned(string(raw), []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	var cl josejwt.Claims
	if err := tok.Claims(g.s.WorkloadKey(), &cl); err != nil {
		t.Fatalf("the token does not verify under bcgw's workload key: %v", err)
	}
	if err := cl.ValidateWithLeeway(josejwt.Expected{Issuer: "bcgw", Subject: a.NodeID, AnyAudience: josejwt.Audience{"https://vault.example"}, Time: time.Now()}, 0); err != nil {
		t.Errorf("claims %+v: %v", cl, err)
	}
	if exp := cl.Expiry.Time(); exp.After(time.Now().Add(agentsvc.WorkloadTokenTTL + time.Second)) {
		t.Errorf("expires %s", exp)
	}
	other, _ := pki.GenerateKey()
	if _, ans, _ := ask("wt-2", "x", other); ans.GetError() == "" || ans.GetSealed() != "" {
		t.Errorf("signed by another key: %+v", ans)
	}
	if _, ans, _ := ask("wt-3", "has space", a.Key); !strings.Contains(ans.GetError(), "audience") {
		t.Errorf("a bad audience: %+v", ans)
	}
}
