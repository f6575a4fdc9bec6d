package gateway_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/store/pgstore"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Two gateways on one database rotate the command-signing key at the same
// moment: one rotation is stored (the new key with the bundle naming it,
// one transaction), the other changes nothing and says so; both gateways
// then sign with the winner's key, the bundle names the old key and that
// one, and a third gateway starting on the database signs with it too.
func TestCommandKeyRotationAtOnceAcrossGateways(t *testing.T) {
	g1, g2, cfg := twoGatewaysOn(t, gateway.Config{})
	old := adminapi.PinOfSPKI(g1.s.OwnCommandKey())
	if p := adminapi.PinOfSPKI(g2.s.OwnCommandKey()); p != old {
		t.Fatalf("the gateways sign with %s and %s", old, p)
	}
	var wg sync.WaitGroup
	rs := make([]adminapi.KeyRotation, 2)
	errs := make([]error, 2)
	for i, g := range []*gw{g1, g2} {
		wg.Go(func() { rs[i], errs[i] = g.s.RotateCommandKey() })
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if won >= 0 {
				t.Fatalf("both rotations were stored: %+v", rs)
			}
			won = i
		case !strings.Contains(err.Error(), "rotated through another gateway meanwhile"):
			t.Errorf("the rotation that lost: %v", err)
		}
	}
	if won < 0 {
		t.Fatalf("no rotation was stored: %v", errs)
	}
	r := rs[won]
	if r.OldPin != old || r.NewPin == old || r.Version != 2 {
		t.Fatalf("the rotation: %+v", r)
	}
	for i, g := range []*gw{g1, g2} {
		waitFor(t, "each gateway to sign with the new key", func() bool { return adminapi.PinOfSPKI(g.s.OwnCommandKey()) == r.NewPin })
		v, err := g.s.Trust()
		if err != nil || v.Version != 2 || len(v.Roots) != 2 || v.Roots[0].Pin != old || v.Roots[1].Pin != r.NewPin || !v.OwnKeyIsRoot {
			t.Errorf("gw%d's trust view: %+v %v", i+1, v, err)
		}
	}
	cfg.DataDir = t.TempDir()
	g3 := startGateway(t, cfg)
	if p := adminapi.PinOfSPKI(g3.s.OwnCommandKey()); p != r.NewPin {
		t.Errorf("a gateway started after the rotation signs with %s, want %s", p, r.NewPin)
	}
}

// A rotation stored with no trust notice (its gateway stopped right after
// the transaction, or the notice was lost): each gateway takes the bundle
// and then the key at its next sweep, draining its sessions first, and a
// gateway restarted after it signs with the new key.
func TestCommandKeyRotationWithoutNotice(t *testing.T) {
	g1, g2, cfg := twoGatewaysOn(t, gateway.Config{})
	a := g2.join(t)
	// The session's context bounds the wait for its Drain.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, f, err := openSession(t, ctx, g2.client(t, certOf(a)), a.NodeID)
	if err != nil || f.GetWelcome().GetTrustBundle().GetVersion() != 1 {
		t.Fatalf("session on the second gateway: %v %v", f, err)
	}
	old := adminapi.PinOfSPKI(g2.s.OwnCommandKey())

	// What rotateShared stores, written straight to the database.
	pg, err := pgstore.Open(context.Background(), cfg.Database)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	kk, err := kek.ReadFile(cfg.KEKFile)
	if err != nil {
		t.Fatal(err)
	}
	join, err := pki.ParsePrivateKeyPEM(g1.s.KeyFiles()["join-signing.key"])
	if err != nil {
		t.Fatal(err)
	}
	type stored struct {
		Document   []byte `json:"document"`
		SigningKey []byte `json:"signing_key"`
		Signature  []byte `json:"signature"`
	}
	raw, err := pg.Meta("trust/bundle")
	var sb stored
	if err != nil || json.Unmarshal(raw, &sb) != nil {
		t.Fatalf("the stored bundle: %q %v", raw, err)
	}
	pin, _ := pki.Pin(join.Public())
	doc, err := bundle.Verify(&bcdv1.TrustBundle{Document: sb.Document, SigningKey: sb.SigningKey, Signature: sb.Signature}, pin)
	if err != nil {
		t.Fatal(err)
	}
	next, _ := pki.GenerateKey()
	doc.Version++
	doc.CommandSigningRoots = append(doc.CommandSigningRoots, spkiOf(t, next))
	tb, err := bundle.Sign(join, doc)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(stored{Document: tb.Document, SigningKey: tb.SigningKey, Signature: tb.Signature})
	sealed, err := keys.SealNext(kk, keys.CommandKeyFile, 2, next)
	if err != nil {
		t.Fatal(err)
	}
	stored0 := time.Now()
	if ok, err := pg.RotateKey(kk.Fingerprint(), sealed, "trust/bundle", raw, b); !ok || err != nil {
		t.Fatalf("store the rotation: %v %v", ok, err)
	}
	newPin := adminapi.PinOfSPKI(spkiOf(t, next))

	for {
		f, err := st.Receive()
		if err != nil {
			t.Fatalf("before a Drain: %v", err)
		}
		if f.GetDrain() != nil {
			break
		}
	}
	if p := adminapi.PinOfSPKI(g2.s.OwnCommandKey()); p != old || g2.s.TrustBundle().GetVersion() != 2 {
		t.Fatalf("at its Drain the gateway signs with %s (want still %s) and holds bundle %d", p, old, g2.s.TrustBundle().GetVersion())
	}
	end := time.Now().Add(15 * time.Second)
	for _, g := range []*gw{g1, g2} {
		for adminapi.PinOfSPKI(g.s.OwnCommandKey()) != newPin {
			if time.Now().After(end) {
				t.Fatalf("a gateway still signs with %s 15 s after the rotation was stored", adminapi.PinOfSPKI(g.s.OwnCommandKey()))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Logf("both gateways sign with the new key %s after the rotation was stored", time.Since(stored0).Round(10*time.Millisecond))
	cfg.DataDir = t.TempDir()
	if p := adminapi.PinOfSPKI(startGateway(t, cfg).s.OwnCommandKey()); p != newPin {
		t.Errorf("a gateway started after the rotation signs with %s, want %s", p, newPin)
	}
}
