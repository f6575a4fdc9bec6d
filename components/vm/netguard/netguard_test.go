package netguard

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/helper/netpolicy/netpolicytest"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

const section = `{"instances":[
 {"id":"vm-a","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0a:00:01","addresses":["10.9.0.5/24"],"policy":"PRIVATE"}]},
 {"id":"vm-h","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0c:00:01","addresses":["10.9.0.1/24"],"policy":"EGRESS"}]},
 {"id":"vm-s","state":"STOPPED","nics":[{"bridge":"br0","mac":"52:54:00:0d:00:01","addresses":["10.9.0.8/24"],"policy":"EGRESS"}]}]}`

func newGuard(t *testing.T) (*Guard, *netpolicytest.Helper) {
	ns := netpolicytest.New(t)
	ns.Bridge("br0", "10.9.0.1/24")
	h := &netpolicytest.Helper{NS: ns}
	g := New(h, nil)
	failed, err := g.Apply(context.Background(), []byte(section), rootsig.Proof{})
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 1 || !strings.Contains(failed["vm-h"], "host bridge") {
		t.Fatalf("failed %v", failed)
	}
	return g, h
}

var addrA = netip.MustParseAddr("10.9.0.5")

// TestOwner: an address is trusted for the instance that holds it under
// the loaded tables; no address of a failed instance, no other address.
func TestOwner(t *testing.T) {
	g, _ := newGuard(t)
	if id, ok := g.Owner(addrA); !ok || id != "vm-a" {
		t.Fatalf("Owner(%s) = %q %v", addrA, id, ok)
	}
	for _, a := range []string{"10.9.0.1", "10.9.0.77", "::ffff:10.9.0.77", "10.9.0.8"} {
		if id, ok := g.Owner(netip.MustParseAddr(a)); ok {
			t.Errorf("Owner(%s) = %s", a, id)
		}
	}
	if id, ok := g.Owner(netip.MustParseAddr("::ffff:10.9.0.5")); !ok || id != "vm-a" {
		t.Errorf("Owner of the IPv4-mapped address = %q %v", id, ok)
	}
	taps := g.Taps()
	if len(taps) != 3 || taps[0].State != Guarded || taps[1].State != Failed {
		t.Fatalf("taps %+v", taps)
	}
}

// TestFlushReloaded: `nft flush table bridge bcd_instances` by hand; the
// 5-second check finds it and loads the policy again, within 6 seconds,
// and no address is trusted while it loads.
func TestFlushReloaded(t *testing.T) {
	g, h := newGuard(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	trustedWhileLoading := make(chan bool, 4)
	h.OnLoad(func() {
		_, ok := g.Owner(addrA)
		trustedWhileLoading <- ok
	})
	go g.Run(ctx, Interval)
	loaded, _ := h.Count(ctx)
	h.NS.Run("nft", "flush", "table", "bridge", "bcd_instances")
	flushed := time.Now()
	if n, _ := h.Count(ctx); n >= loaded {
		t.Fatalf("after the flush %d rules, before %d", n, loaded)
	}
	for {
		if n, _ := h.Count(ctx); n == loaded {
			break
		}
		if time.Since(flushed) > 6*time.Second {
			t.Fatalf("the rules were not back within 6 s of the flush")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("rules back %v after the flush", time.Since(flushed).Round(10*time.Millisecond))
	select {
	case ok := <-trustedWhileLoading:
		if ok {
			t.Fatal("an address was trusted while the flushed tables loaded again")
		}
	case <-time.After(time.Second):
		t.Fatal("the policy was not loaded again through the helper")
	}
	for deadline := time.Now().Add(2 * time.Second); !g.Loaded(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the guard does not count the tables as loaded after the reload")
		}
	}
	if _, ok := g.Owner(addrA); !ok {
		t.Fatal("the address is not trusted again after the reload")
	}
}
