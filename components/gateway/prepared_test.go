package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// reindent re-indents JSON, as a person or a tool may between the steps.
func reindent(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "    ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPreparedCommand: prepare, sign elsewhere, submit; the agent gets
// the command with that signature, and it verifies under a bundle naming
// the signer. An unsigned prepared command is sent unsigned; malformed
// ones are refused.
func TestPreparedCommand(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ac := adminapi.NewClient(g.dir, "", "")
	ext, _ := pki.GenerateKey()
	if _, err := g.s.AddTrustRoot(spkiOf(t, ext)); err != nil {
		t.Fatal(err)
	}
	a := g.join(t)
	w, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	roots := bundleOf(t, g, w).Roots()

	p, err := ac.PrepareCommand(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "agent.ping", Body: json.RawMessage(`{ "a": "<b> & c" }`), DeadlineSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if p.NodeID != a.NodeID || p.Kind != "agent.ping" || len(p.Signature) != 0 || string(p.Body) != `{"a":"<b> & c"}` ||
		time.Until(time.UnixMilli(p.DeadlineMS)) < 59*time.Minute {
		t.Fatalf("prepared %+v", p)
	}
	if _, err := g.s.Store().Command(p.ID); err == nil {
		t.Error("prepare stored the command")
	}
	signed, what, err := adminapi.SignPrepared(ext, reindent(t, p))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(what, p.ID) || !strings.Contains(what, a.NodeID) {
		t.Errorf("sign says %q", what)
	}
	sp := *signed.(*adminapi.PreparedCommand)
	if len(sp.Signature) != intent.SignatureSize {
		t.Fatalf("signature of %d bytes", len(sp.Signature))
	}
	// Through a file again: re-indented, decoded strictly.
	back, _, err := adminapi.DecodePrepared(reindent(t, sp))
	if err != nil {
		t.Fatal(err)
	}
	v, err := ac.SubmitCommand(ctx, adminapi.SubmitCommandRequest{Command: *back})
	if err != nil || v.ID != p.ID || !v.Signed || v.Warning != "" {
		t.Fatalf("submit: %+v %v", v, err)
	}
	c := recv(t, st).GetCommand()
	if c.GetId() != p.ID || !bytes.Equal(c.GetSignature(), sp.Signature) || string(c.GetBody()) != `{"a":"<b> & c"}` {
		t.Fatalf("command frame %v", c)
	}
	if err := roots.VerifyCommand(c); err != nil {
		t.Errorf("the submitted command does not verify: %v", err)
	}
	// The same file again is refused: the id exists.
	if _, err := ac.SubmitCommand(ctx, adminapi.SubmitCommandRequest{Command: *back}); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("a second submit: %v", err)
	}
	// A re-send after a redial carries the submitted signature.
	_ = st.CloseRequest()
	waitFor(t, "the session to end", func() bool { return !g.s.Connected(a.NodeID) })
	_, st = g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	if c := recv(t, st).GetCommand(); c.GetId() != p.ID || !bytes.Equal(c.GetSignature(), sp.Signature) {
		t.Errorf("re-sent command %v", c)
	}

	// Unsigned: sent unsigned, bcgw adds nothing; the answer warns.
	u, err := g.s.PrepareCommand(a.NodeID, "agent.ping", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	v, err = ac.SubmitCommand(ctx, adminapi.SubmitCommandRequest{Command: u})
	if err != nil || v.Signed || !strings.Contains(v.Warning, "UNSIGNED") {
		t.Fatalf("unsigned submit: %+v %v", v, err)
	}
	if c := recv(t, st).GetCommand(); c.GetId() != u.ID || len(c.GetSignature()) != 0 {
		t.Errorf("unsigned command frame %v", c)
	} else if err := roots.VerifyCommand(c); !errors.Is(err, intent.ErrUnsigned) {
		t.Errorf("unsigned command verifies: %v", err)
	}
	// Signed by a key that is no root: sent, with a warning.
	stranger, _ := pki.GenerateKey()
	sx, _ := g.s.PrepareCommand(a.NodeID, "agent.ping", nil, 0)
	sg, _, err := adminapi.SignPrepared(stranger, reindent(t, sx))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ac.SubmitCommand(ctx, adminapi.SubmitCommandRequest{Command: *sg.(*adminapi.PreparedCommand)}); err != nil || !strings.Contains(v.Warning, "BAD_SIGNATURE") {
		t.Errorf("stranger's command: %+v %v", v, err)
	}

	// Malformed or stale files are refused.
	good, _ := g.s.PrepareCommand(a.NodeID, "agent.ping", nil, 0)
	for name, f := range map[string]func(p *adminapi.PreparedCommand){
		"bad id":           func(p *adminapi.PreparedCommand) { p.ID = "cmd_../x" },
		"no kind":          func(p *adminapi.PreparedCommand) { p.Kind = "" },
		"passed deadline":  func(p *adminapi.PreparedCommand) { p.DeadlineMS = time.Now().Add(-time.Second).UnixMilli() },
		"no deadline":      func(p *adminapi.PreparedCommand) { p.DeadlineMS = 0 },
		"short signature":  func(p *adminapi.PreparedCommand) { p.Signature = []byte("abc") },
		"body not JSON":    func(p *adminapi.PreparedCommand) { p.Body = json.RawMessage(`{`) },
		"unknown node":     func(p *adminapi.PreparedCommand) { p.NodeID = "node_nobody" },
		"bad lane":         func(p *adminapi.PreparedCommand) { p.Lane = "Lane 1" },
		"bad workflow id":  func(p *adminapi.PreparedCommand) { p.WorkflowID = "a b" },
		"node id with dot": func(p *adminapi.PreparedCommand) { p.NodeID = "node.x" },
	} {
		p := good
		f(&p)
		if _, _, err := g.s.SubmitCommand(p, nil); err == nil {
			t.Errorf("%s: submitted", name)
		}
	}
	// An unknown field in the file, and a spec given as a command.
	if _, _, err := adminapi.DecodePrepared([]byte(`{"id":"` + good.ID + `","node_id":"x","kind":"k","deadline_unix_ms":1,"extra":1}`)); err == nil {
		t.Error("an unknown field decoded")
	}
	if _, err := ac.PrepareCommand(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "deploy.image", UserData: []byte("x")}); err == nil {
		t.Error("user data prepared")
	}
	if _, err := ac.PrepareCommand(ctx, adminapi.CommandRequest{Node: "node_nobody", Kind: "agent.ping"}); err == nil {
		t.Error("a command prepared for an unknown node")
	}
}

// TestPreparedSpec: prepare, sign, submit a full spec and a patch; the
// agent gets them with their signatures, a full copy of a submitted
// generation keeps its signature, and a spec whose generation moved since
// it was prepared is refused.
func TestPreparedSpec(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ac := adminapi.NewClient(g.dir, "", "")
	ext, _ := pki.GenerateKey()
	if _, err := g.s.AddTrustRoot(spkiOf(t, ext)); err != nil {
		t.Fatal(err)
	}
	a := g.join(t)
	w, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	roots := bundleOf(t, g, w).Roots()
	noFrameBefore(t, st, "no spec yet")

	p, err := ac.PrepareSpec(ctx, a.NodeID, []byte(`{"daemon": {}, "host": {"motd": "<hi> & bye"}}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if p.Node != a.NodeID || p.Generation != 1 || p.Patch || p.BaseGeneration != 0 || string(p.Spec) != `{"host":{"motd":"<hi> & bye"},"daemon":{}}` {
		t.Fatalf("prepared %+v %s", p, p.Spec)
	}
	if gen, _ := specOf(t, g, a.NodeID); gen != 0 {
		t.Fatalf("prepare stored generation %d", gen)
	}
	signed, _, err := adminapi.SignPrepared(ext, reindent(t, p))
	if err != nil {
		t.Fatal(err)
	}
	_, sp, err := adminapi.DecodePrepared(reindent(t, signed))
	if err != nil {
		t.Fatal(err)
	}
	v, err := ac.SubmitSpec(ctx, *sp)
	if err != nil || v.Generation != 1 || v.Warning != "" {
		t.Fatalf("submit: %+v %v", v, err)
	}
	ds := recvDesired(t, st)
	if ds.GetGeneration() != 1 || ds.GetPatch() || !bytes.Equal(ds.GetSignature(), sp.Signature) || string(ds.GetSpec()) != string(p.Spec) {
		t.Fatalf("desired state %v", ds)
	}
	var held heldSpec
	if err := roots.VerifyDesiredState(a.NodeID, ds, held.full(t, ds)); err != nil {
		t.Errorf("submitted spec: %v", err)
	}
	// want_full_spec: the stored generation in full with the submitted
	// signature, not bcgw's own.
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: &bcdv1.StatusReport{WantFullSpec: true}}})
	if ds := recvDesired(t, st); !bytes.Equal(ds.GetSignature(), sp.Signature) || roots.VerifyDesiredState(a.NodeID, ds, held.full(t, ds)) != nil {
		t.Errorf("full copy of a submitted generation signed %x, want the submitted %x", ds.GetSignature(), sp.Signature)
	}

	// A patch, prepared; the generation moves before it is submitted.
	pp, err := g.s.PrepareSpec(a.NodeID, []byte(`{"telemetry":{"every":5}}`), true)
	if err != nil || !pp.Patch || pp.Generation != 2 || pp.BaseGeneration != 1 {
		t.Fatalf("prepared patch %+v %v", pp, err)
	}
	spp, _, err := adminapi.SignPrepared(ext, reindent(t, pp))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.s.PatchSpec(a.NodeID, []byte(`{"host":{"tz":"UTC"}}`)); err != nil {
		t.Fatal(err)
	}
	held.full(t, recvDesired(t, st))
	_, err = ac.SubmitSpec(ctx, *spp.(*adminapi.PreparedSpec))
	if err == nil || !strings.Contains(err.Error(), "prepare it again") {
		t.Fatalf("a patch prepared for a moved generation: %v", err)
	}
	if _, _, err := g.s.SubmitSpec(*spp.(*adminapi.PreparedSpec)); !errors.Is(err, adminapi.ErrPreparedStale) {
		t.Errorf("SubmitSpec: %v, want ErrPreparedStale", err)
	}
	if gen, _ := specOf(t, g, a.NodeID); gen != 2 {
		t.Errorf("generation %d after the refusal, want 2", gen)
	}
	noFrameBefore(t, st, "refused submit")

	// Prepared again: sent as the patch it is, with its signature.
	pp, err = g.s.PrepareSpec(a.NodeID, []byte(`{"telemetry":{"every":5}}`), true)
	if err != nil {
		t.Fatal(err)
	}
	spp, _, _ = adminapi.SignPrepared(ext, reindent(t, pp))
	if gen, warn, err := g.s.SubmitSpec(*spp.(*adminapi.PreparedSpec)); err != nil || gen != 3 || warn != "" {
		t.Fatalf("submit patch: %d %q %v", gen, warn, err)
	}
	ds = recvDesired(t, st)
	if !ds.GetPatch() || ds.GetGeneration() != 3 || ds.GetBaseGeneration() != 2 || string(ds.GetSpec()) != `{"telemetry":{"every":5}}` {
		t.Fatalf("patch frame %v", ds)
	}
	if err := roots.VerifyDesiredState(a.NodeID, ds, held.full(t, ds)); err != nil {
		t.Errorf("submitted patch: %v", err)
	}

	// Unsigned: sent unsigned, and its full copies stay unsigned.
	pu, err := g.s.PrepareSpec(a.NodeID, []byte(`{"daemon":{"x":1}}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if _, warn, err := g.s.SubmitSpec(pu); err != nil || !strings.Contains(warn, "UNSIGNED") {
		t.Fatalf("unsigned submit: %q %v", warn, err)
	}
	if ds := recvDesired(t, st); len(ds.GetSignature()) != 0 {
		t.Errorf("unsigned submitted spec sent signed")
	}
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: &bcdv1.StatusReport{WantFullSpec: true}}})
	if ds := recvDesired(t, st); len(ds.GetSignature()) != 0 {
		t.Errorf("bcgw signed a full copy of a generation submitted unsigned")
	}

	// A spec edited after it was signed is stored (it is a valid spec),
	// but the answer warns that agents will refuse it.
	pc, _ := g.s.PrepareSpec(a.NodeID, []byte(`{"daemon":{"x":2}}`), false)
	spc, _, _ := adminapi.SignPrepared(ext, reindent(t, pc))
	edited := *spc.(*adminapi.PreparedSpec)
	edited.Spec = json.RawMessage(`{"daemon":{"x":3}}`)
	if _, warn, err := g.s.SubmitSpec(edited); err != nil || !strings.Contains(warn, "BAD_SIGNATURE") {
		t.Errorf("edited spec: %q %v", warn, err)
	}
	recvDesired(t, st)
	// Not in the canonical form prepare printed, or nothing to prepare.
	pn, _ := g.s.PrepareSpec(a.NodeID, []byte(`{"daemon":{"x":9}}`), false)
	pn.Spec = json.RawMessage(`{"daemon":{"x":9},"host":null}`)
	if _, _, err := g.s.SubmitSpec(pn); err == nil || !strings.Contains(err.Error(), "prepare it again") {
		t.Errorf("a spec not in its canonical form: %v", err)
	}
	cur, spec := specOf(t, g, a.NodeID)
	if _, err := g.s.PrepareSpec(a.NodeID, []byte(spec), false); err == nil || !strings.Contains(err.Error(), "nothing to prepare") {
		t.Errorf("preparing the current spec: %v", err)
	}
	for name, f := range map[string]func(p *adminapi.PreparedSpec){
		"no generation":    func(p *adminapi.PreparedSpec) { p.Generation = 0 },
		"patch base":       func(p *adminapi.PreparedSpec) { p.Patch, p.BaseGeneration = true, p.Generation-2 },
		"full with a base": func(p *adminapi.PreparedSpec) { p.BaseGeneration = 1 },
		"not an object":    func(p *adminapi.PreparedSpec) { p.Spec = json.RawMessage(`[1]`) },
		"unknown section":  func(p *adminapi.PreparedSpec) { p.Spec = json.RawMessage(`{"nope":{}}`) },
		"short signature":  func(p *adminapi.PreparedSpec) { p.Signature = []byte("abc") },
		"unknown node":     func(p *adminapi.PreparedSpec) { p.Node = "node_nobody" },
	} {
		p := adminapi.PreparedSpec{Node: a.NodeID, Generation: cur + 1, Spec: json.RawMessage(`{"daemon":{"y":1}}`)}
		f(&p)
		if _, _, err := g.s.SubmitSpec(p); err == nil {
			t.Errorf("%s: submitted", name)
		}
	}
}

// A site agent's spec: prepare keeps the gateway's boot lease in the
// full spec; a prepared patch may not name it.
func TestPreparedSpecSite(t *testing.T) {
	g := startGateway(t, gateway.Config{LeaseTTL: time.Minute})
	s := g.joinRole(t, "site")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := g.agentSession(t, ctx, s, &bcdv1.Hello{})
	recvDesired(t, st) // the lease
	gen, spec := specOf(t, g, s.NodeID)
	p, err := g.s.PrepareSpec(s.NodeID, []byte(`{"site":{"boot_lease":{"held":false}},"daemon":{}}`), false)
	if err != nil {
		t.Fatal(err)
	}
	held, _ := leaseOf(t, []byte(spec))
	if l, ok := leaseOf(t, p.Spec); !ok || l != held || p.Generation != gen+1 {
		t.Errorf("prepared site spec %s, want the held lease %+v kept", p.Spec, held)
	}
	if _, err := g.s.PrepareSpec(s.NodeID, []byte(`{"site":{"boot_lease":null}}`), true); err == nil {
		t.Error("a patch naming the boot lease was prepared")
	}
	if g2, _, err := g.s.SubmitSpec(p); err != nil || g2 != gen+1 {
		t.Errorf("submit: %d %v", g2, err)
	}
}
