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

	josejwt "github.com/go-jose/go-jose/v4/jwt"

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/agentsvc"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/seal"
	"github.com/go-jose/go-jose/v4"
	"google.golang.org/protobuf/proto"
)

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
	ask := func(id, instance, audience string, signer crypto.Signer) (*seal.Opener, *bcdv1.WorkloadTokenAnswer, []byte) {
		req := &bcdv1.WorkloadTokenRequest{RequestId: id, Audience: audience, Instance: instance}
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
	o, ans, frame := ask("wt-1", "", "https://vault.example", a.Key)
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
	if _, ans, _ := ask("wt-2", "", "x", other); ans.GetError() == "" || ans.GetSealed() != "" {
		t.Errorf("signed by another key: %+v", ans)
	}
	if _, ans, _ := ask("wt-3", "", "has space", a.Key); !strings.Contains(ans.GetError(), "audience") {
		t.Errorf("a bad audience: %+v", ans)
	}

	// An instance's token (the metadata service's): only for an instance
	// the node's desired spec runs, and it names the instance.
	spec := `{"instances":{"images":[{"sha256":"` + strings.Repeat("a", 64) + `","url":"https://img.example/d.qcow2","format":"qcow2"}],
	 "instances":[{"id":"vm-1","allocation":"al","state":"RUNNING","vcpus":1,"memory_mib":512,"image":"` + strings.Repeat("a", 64) + `"},
	              {"id":"vm-2","allocation":"al","state":"STOPPED","vcpus":1,"memory_mib":512,"image":"` + strings.Repeat("a", 64) + `"}]}}`
	if _, err := g.s.SetSpec(a.NodeID, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	o, ans, _ = ask("wt-4", "vm-1", "sts.example", a.Key)
	raw, err = o.OpenSealed(ans.GetSealed(), time.Now())
	if err != nil {
		t.Fatalf("vm-1's token: %v (%s)", err, ans.GetError())
	}
	tok, err = josejwt.ParseSigned(string(raw), []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	var ic struct {
		josejwt.Claims
		Instance string `json:"instance"`
	}
	if err := tok.Claims(g.s.WorkloadKey(), &ic); err != nil || ic.Instance != "vm-1" || ic.Subject != a.NodeID || !ic.Audience.Contains("sts.example") {
		t.Fatalf("vm-1's token: %+v %v", ic, err)
	}
	for _, inst := range []string{"vm-2", "vm-9"} {
		if _, ans, _ := ask("wt-"+inst, inst, "sts.example", a.Key); !strings.Contains(ans.GetError(), "runs no instance") || ans.GetSealed() != "" {
			t.Errorf("instance %s: %+v", inst, ans)
		}
	}
}
