package gateway_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// bundleOf verifies a Welcome's trust bundle against the gateway's
// join-signing pin, as an agent does, and returns its document.
func bundleOf(t *testing.T, g *gw, w *bcdv1.Welcome) bundle.Document {
	t.Helper()
	if w.GetTrustBundle() == nil {
		t.Fatal("Welcome carries no trust bundle")
	}
	doc, err := bundle.Verify(w.GetTrustBundle(), g.pins.JoinSigning)
	if err != nil {
		t.Fatalf("the Welcome's trust bundle does not verify with the join-signing pin: %v", err)
	}
	if tb := w.GetTrustBundle(); tb.GetVersion() != doc.Version || len(tb.GetCommandSigningRoots()) != len(doc.CommandSigningRoots) {
		t.Errorf("the frame's version %d and %d roots differ from its document's %d and %d",
			tb.GetVersion(), len(tb.GetCommandSigningRoots()), doc.Version, len(doc.CommandSigningRoots))
	}
	return doc
}

func spkiOf(t *testing.T, k crypto.Signer) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// recvDrain reads frames until a Drain (commands and spec frames may come
// first), failing after 5 s.
func recvDrain(t *testing.T, st agentStream) *bcdv1.Drain {
	t.Helper()
	for {
		f := recv(t, st)
		if d := f.GetDrain(); d != nil {
			return d
		}
	}
}

// TestTrustBundleInWelcome: at first start bcgw makes its command-signing
// key and trust bundle version 1 naming it; every Welcome carries the
// bundle signed by the join-signing key; a restart keeps both.
func TestTrustBundleInWelcome(t *testing.T) {
	dir := t.TempDir()
	g := startGateway(t, gateway.Config{DataDir: dir})
	st, err := os.Stat(filepath.Join(dir, keys.CommandKeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("command-signing key: %v %v, want a 0600 file", st, err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, keys.CommandKeyFile))
	key, err := pki.ParsePrivateKeyPEM(b)
	if err != nil {
		t.Fatalf("command-signing.key: %v", err)
	}
	own := spkiOf(t, key)
	if !bytes.Equal(g.s.OwnCommandKey(), own) {
		t.Error("OwnCommandKey is not the key in command-signing.key")
	}
	a := g.join(t)
	w, st0 := g.welcomeOf(t, context.Background(), a, &bcdv1.Hello{})
	doc := bundleOf(t, g, w)
	if doc.Version != 1 || len(doc.CommandSigningRoots) != 1 || !bytes.Equal(doc.CommandSigningRoots[0], own) || doc.Approvers != nil {
		t.Fatalf("first bundle %+v, want version 1 with bcgw's own key as the only root", doc)
	}
	// A bundle signed by another key than the pinned one is refused.
	other, _ := pki.GenerateKey()
	otherPin, _ := pki.Pin(other.Public())
	if _, err := bundle.Verify(w.GetTrustBundle(), otherPin); err == nil {
		t.Error("the bundle verifies against another pin")
	}
	v, err := g.s.Trust()
	if err != nil || v.Version != 1 || !v.OwnKeyIsRoot || len(v.Roots) != 1 || !v.Roots[0].Own || v.OwnKey != v.Roots[0].Pin {
		t.Fatalf("Trust %+v %v", v, err)
	}

	// A restart on the same directory keeps the key and the very bundle.
	tb := g.s.TrustBundle()
	_ = st0.CloseRequest()
	if err := g.stop(true); err != nil {
		t.Fatal(err)
	}
	g2 := startGateway(t, gateway.Config{DataDir: dir})
	if !bytes.Equal(g2.s.OwnCommandKey(), own) {
		t.Error("the command-signing key changed across a restart")
	}
	if tb2 := g2.s.TrustBundle(); !bytes.Equal(tb2.GetDocument(), tb.GetDocument()) || !bytes.Equal(tb2.GetSignature(), tb.GetSignature()) {
		t.Error("the trust bundle changed across a restart")
	}
}

// TestTrustRootsChange: add-root and remove-root each make a new version,
// drain live sessions, and the next Welcome carries the new bundle; a
// change to nothing keeps the version; keys that are not P-256 are
// refused.
func TestTrustRootsChange(t *testing.T) {
	dir := t.TempDir()
	g := startGateway(t, gateway.Config{DataDir: dir})
	a := g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})

	ext, _ := pki.GenerateKey()
	extSPKI := spkiOf(t, ext)
	ac := adminapi.NewClient(dir, "", "")
	ch, err := ac.AddTrustRoot(ctx, extSPKI)
	if err != nil || ch.Version != 2 || !ch.Changed || ch.Roots != 2 {
		t.Fatalf("add-root: %+v %v, want version 2 with 2 roots", ch, err)
	}
	d := recvDrain(t, st)
	if d.GetReason() != "trust bundle changed" || d.GetRedialAfterMs() == 0 || d.GetRedialAfterMs() > 1000 {
		t.Errorf("Drain %v, want reason \"trust bundle changed\" and a short redial", d)
	}
	waitFor(t, "the drained session to end", func() bool { return !g.s.Connected(a.NodeID) })
	w, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	doc := bundleOf(t, g, w)
	if doc.Version != 2 || len(doc.CommandSigningRoots) != 2 || !bytes.Equal(doc.CommandSigningRoots[1], extSPKI) {
		t.Fatalf("bundle after add-root: %+v", doc)
	}

	// The same root again: no change, no drain.
	if ch, err := g.s.AddTrustRoot(extSPKI); err != nil || ch.Changed || ch.Version != 2 {
		t.Errorf("adding a root twice: %+v %v", ch, err)
	}
	noFrameBefore(t, st, "unchanged bundle")

	// Refusals: a key of another curve or kind, a non-root to remove.
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	for name, der := range map[string][]byte{"P-384": spkiOf(t, p384), "RSA": spkiOf(t, rsaKey), "garbage": []byte("x")} {
		if _, err := g.s.AddTrustRoot(der); err == nil {
			t.Errorf("%s root accepted", name)
		} else if name != "garbage" && !strings.Contains(err.Error(), "P-256") {
			t.Errorf("%s root refused with %q; want it to name P-256", name, err)
		}
	}
	if _, err := ac.AddTrustRoot(ctx, spkiOf(t, p384)); err == nil || !strings.Contains(err.Error(), "P-256") {
		t.Errorf("P-384 root over the admin API: %v", err)
	}
	stranger, _ := pki.GenerateKey()
	if _, err := g.s.RemoveTrustRoot(spkiOf(t, stranger)); err == nil || !strings.Contains(err.Error(), "not a command-signing root") {
		t.Errorf("removing a key that is no root: %v", err)
	}
	if v, _ := g.s.Trust(); v.Version != 2 {
		t.Errorf("refusals changed the version to %d", v.Version)
	}

	// remove-root: version 3, drained, the next Welcome has it.
	ch, err = ac.RemoveTrustRoot(ctx, g.s.OwnCommandKey())
	if err != nil || ch.Version != 3 || !ch.Changed || ch.Roots != 1 {
		t.Fatalf("remove-root: %+v %v", ch, err)
	}
	recvDrain(t, st)
	waitFor(t, "the drained session to end", func() bool { return !g.s.Connected(a.NodeID) })
	w, st = g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	if doc := bundleOf(t, g, w); doc.Version != 3 || len(doc.CommandSigningRoots) != 1 || !bytes.Equal(doc.CommandSigningRoots[0], extSPKI) {
		t.Fatalf("bundle after remove-root: %+v", doc)
	}
	v, err := ac.Trust(ctx)
	if err != nil || v.Version != 3 || v.OwnKeyIsRoot || len(v.Roots) != 1 || v.Roots[0].Own {
		t.Errorf("trust view %+v %v", v, err)
	}

	// The acknowledgement of a StatusReport, and Hello's version, are kept.
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: &bcdv1.StatusReport{TrustVersion: 3}}})
	waitFor(t, "the acknowledged version", func() bool { n, _ := g.s.Store().Node(a.NodeID); return n.TrustVersion == 3 })
	v, _ = g.s.Trust()
	if len(v.Nodes) != 1 || v.Nodes[0].Node != a.NodeID || v.Nodes[0].TrustVersion != 3 || v.Nodes[0].At == nil || !v.Nodes[0].Connected {
		t.Errorf("trust view nodes %+v", v.Nodes)
	}
	_ = st.CloseRequest()
	waitFor(t, "the session to end", func() bool { return !g.s.Connected(a.NodeID) })
	g.agentSession(t, ctx, a, &bcdv1.Hello{TrustBundleVersion: 2})
	if n, _ := g.s.Store().Node(a.NodeID); n.TrustVersion != 2 {
		t.Errorf("trust version %d after a Hello saying 2", n.TrustVersion)
	}
}

// TestWithoutCommandKey: --command-key none makes no key, sends trust
// bundle version 1 with no roots, and signs no command or desired state.
func TestWithoutCommandKey(t *testing.T) {
	dir := t.TempDir()
	g := startGateway(t, gateway.Config{DataDir: dir, CommandKey: fleet.CommandKeyNone})
	if _, err := os.Stat(filepath.Join(dir, keys.CommandKeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("command-signing.key made with --command-key none: %v", err)
	}
	if g.s.OwnCommandKey() != nil {
		t.Error("an own key without one")
	}
	a := g.join(t)
	cmd, err := g.s.SendCommand(a.NodeID, "agent.ping", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.s.SetSpec(a.NodeID, []byte(`{"host":{"hostname":"h"}}`)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	if doc := bundleOf(t, g, w); doc.Version != 1 || len(doc.CommandSigningRoots) != 0 {
		t.Fatalf("bundle %+v, want version 1 with no roots", doc)
	}
	if c := recv(t, st).GetCommand(); c.GetId() != cmd.ID || len(c.GetSignature()) != 0 {
		t.Errorf("command %v, want %s unsigned", c, cmd.ID)
	}
	if ds := recvDesired(t, st); len(ds.GetSignature()) != 0 {
		t.Errorf("desired state signed: %v", ds)
	}
	if _, err := g.s.PatchSpec(a.NodeID, []byte(`{"daemon":{}}`)); err != nil {
		t.Fatal(err)
	}
	if ds := recvDesired(t, st); !ds.GetPatch() || len(ds.GetSignature()) != 0 {
		t.Errorf("patch %v, want it unsigned", ds)
	}
	v, err := g.s.Trust()
	if err != nil || v.OwnKey != "" || v.OwnKeyIsRoot || len(v.Roots) != 0 {
		t.Errorf("trust view %+v %v", v, err)
	}
}

// A command key given as a file is used as it is; one that does not
// exist, or is not P-256, stops the start.
func TestCommandKeyFile(t *testing.T) {
	k, _ := pki.GenerateKey()
	pemKey, _ := pki.MarshalPrivateKeyPEM(k)
	path := filepath.Join(t.TempDir(), "cmd.key")
	if err := os.WriteFile(path, pemKey, 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, gateway.Config{CommandKey: path})
	if !bytes.Equal(g.s.OwnCommandKey(), spkiOf(t, k)) {
		t.Error("the given command key is not the one in use")
	}
	if _, err := os.Stat(filepath.Join(g.dir, keys.CommandKeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a key was made in the data directory as well: %v", err)
	}
	for name, cfg := range map[string]gateway.Config{
		"absent": {DataDir: t.TempDir(), CommandKey: filepath.Join(t.TempDir(), "absent.key")},
		"public": {DataDir: t.TempDir(), CommandKey: writeFile(t, "pub.pem", pubPEM(t, k), 0o600)},
		"loose":  {DataDir: t.TempDir(), CommandKey: writeFile(t, "loose.key", pemKey, 0o644)},
	} {
		if s, err := gateway.New(cfg); err == nil {
			s.Store().Close()
			t.Errorf("%s command key accepted", name)
		} else if strings.Contains(err.Error(), string(pemKey[30:60])) {
			t.Errorf("%s: the error shows the key: %v", name, err)
		}
	}
}

func writeFile(t *testing.T, name string, b []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func pubPEM(t *testing.T, k crypto.Signer) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spkiOf(t, k)})
}

// TestSignedIntent: every command and desired state bcgw sends verifies
// under the Welcome's bundle for the node it goes to (and for no other),
// and a command re-sent after a redial carries the same signature.
func TestSignedIntent(t *testing.T) {
	g := startGateway(t, gateway.Config{LeaseTTL: time.Minute})
	a := g.join(t)
	cmd, err := g.s.SendCommand(a.NodeID, "agent.ping", []byte(`{"x":"<&>"}`), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmd.Signature) == 0 {
		t.Error("the stored command has no signature")
	}
	if _, err := g.s.SetSpec(a.NodeID, []byte(`{"host":{"hostname":"h1"}}`)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	roots := bundleOf(t, g, w).Roots()
	if roots.Len() != 1 {
		t.Fatalf("%d roots", roots.Len())
	}
	c1 := recv(t, st).GetCommand()
	if c1.GetId() != cmd.ID {
		t.Fatalf("frame %v, want the pending command", c1)
	}
	if err := roots.VerifyCommand(c1); err != nil {
		t.Errorf("pending command: %v", err)
	}
	ds := recvDesired(t, st)
	var held heldSpec
	full := held.full(t, ds)
	if err := roots.VerifyDesiredState(a.NodeID, ds, full); err != nil {
		t.Errorf("full spec after Welcome: %v", err)
	}
	if err := roots.VerifyDesiredState("node_other", ds, full); !errors.Is(err, intent.ErrBadSignature) {
		t.Errorf("the full spec verifies for another node: %v", err)
	}
	// A set, a patch, an answer to want_full_spec.
	if _, err := g.s.PatchSpec(a.NodeID, []byte(`{"telemetry":{"every":5}}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.s.SetSpec(a.NodeID, []byte(`{"daemon":{}}`)); err != nil {
		t.Fatal(err)
	}
	sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Status{Status: &bcdv1.StatusReport{WantFullSpec: true}}})
	for _, what := range []string{"patch", "set", "want_full_spec"} {
		ds := recvDesired(t, st)
		if len(ds.GetSignature()) == 0 {
			t.Errorf("%s: unsigned", what)
		}
		if err := roots.VerifyDesiredState(a.NodeID, ds, held.full(t, ds)); err != nil {
			t.Errorf("%s: %v", what, err)
		}
		if (what == "patch") != ds.GetPatch() {
			t.Errorf("%s: %v", what, ds)
		}
	}
	// A live command.
	live, err := g.s.SendCommand(a.NodeID, "agent.ping", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c2 := recv(t, st).GetCommand()
	if c2.GetId() != live.ID || roots.VerifyCommand(c2) != nil {
		t.Errorf("live command %v: %v", c2, roots.VerifyCommand(c2))
	}
	// A later deadline breaks the signature.
	c2.DeadlineUnixMs += 1000
	if err := roots.VerifyCommand(c2); !errors.Is(err, intent.ErrBadSignature) {
		t.Errorf("a command with a later deadline: %v", err)
	}
	// After a redial both commands come again, with the same bytes.
	_ = st.CloseRequest()
	waitFor(t, "the session to end", func() bool { return !g.s.Connected(a.NodeID) })
	_, st = g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	for _, want := range []*bcdv1.Command{c1, {Id: live.ID, Signature: c2.GetSignature()}} {
		got := recv(t, st).GetCommand()
		if got.GetId() != want.GetId() || !bytes.Equal(got.GetSignature(), want.GetSignature()) {
			t.Errorf("re-sent command %s: signature %x, want %x", got.GetId(), got.GetSignature(), want.GetSignature())
		}
	}

	// A site agent's boot lease patches are signed for it.
	s := g.joinRole(t, "site")
	ss := g.agentSession(t, ctx, s, &bcdv1.Hello{})
	ds = recvDesired(t, ss)
	var siteHeld heldSpec
	if err := roots.VerifyDesiredState(s.NodeID, ds, siteHeld.full(t, ds)); err != nil || !ds.GetPatch() {
		t.Errorf("lease grant %v: %v", ds, err)
	}
	time.Sleep(2 * time.Millisecond)
	sendFrame(t, ss, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Heartbeat{Heartbeat: &bcdv1.Heartbeat{}}})
	ds = recvDesired(t, ss)
	if err := roots.VerifyDesiredState(s.NodeID, ds, siteHeld.full(t, ds)); err != nil {
		t.Errorf("lease renewal %v: %v", ds, err)
	}
}
