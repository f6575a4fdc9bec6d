package gateway_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
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
