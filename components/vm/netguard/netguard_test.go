package netguard

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/helper/netpolicy/netpolicytest"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// nsHelper does in a test's network namespace what bcd helper does for
// netpolicy.apply and firewall.check (components/helper tests the helper
// itself): the policy rendered by netpolicy, loaded and counted by a real
// nft. loading, when set, is called before each load.
type nsHelper struct {
	ns      *netpolicytest.NS
	mu      sync.Mutex
	loads   int
	loading func()
}

func (h *nsHelper) ApplyNetPolicy(ctx context.Context, section []byte, _ rootsig.Proof) (int64, map[string]string, error) {
	h.mu.Lock()
	h.loads++
	hook := h.loading
	h.mu.Unlock()
	if hook != nil {
		hook()
	}
	in, err := netpolicy.Decode(section)
	if err != nil {
		return 0, nil, err
	}
	var host netpolicy.Host
	if err := h.ns.Do(func() (err error) { host, err = netpolicy.ReadHost("/sys", netpolicy.BridgeNames(in)); return err }); err != nil {
		return 0, nil, err
	}
	taps, _, failed := netpolicy.Plan(in, host)
	rules, err := netpolicy.Render(taps, host)
	if err != nil {
		return 0, nil, err
	}
	if _, err := h.ns.Nft(ctx, rules, "-f", "-"); err != nil {
		return 0, nil, err
	}
	n, err := h.count(ctx)
	return n, failed, err
}

func (h *nsHelper) count(ctx context.Context) (int64, error) {
	var n int64
	for _, t := range netpolicy.Tables {
		fam, name, _ := strings.Cut(t, " ")
		out, err := h.ns.Nft(ctx, nil, "-j", "list", "table", fam, name)
		if err != nil {
			return -1, nil
		}
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			return 0, err
		}
		for _, o := range doc.Nftables {
			if _, ok := o["rule"]; ok {
				n++
			}
		}
	}
	return n, nil
}

func (h *nsHelper) CheckFirewall(ctx context.Context, rules int64) (bool, error) {
	n, err := h.count(ctx)
	return err == nil && n == rules, err
}

const section = `{"instances":[
 {"id":"vm-a","nics":[{"bridge":"br0","mac":"52:54:00:0a:00:01","addresses":["10.9.0.5/24"],"policy":"PRIVATE"}]},
 {"id":"vm-h","nics":[{"bridge":"br0","mac":"52:54:00:0c:00:01","addresses":["10.9.0.1/24"],"policy":"EGRESS"}]}]}`

func newGuard(t *testing.T) (*Guard, *nsHelper) {
	ns := netpolicytest.New(t)
	ns.Bridge("br0", "10.9.0.1/24")
	h := &nsHelper{ns: ns}
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
	for _, a := range []string{"10.9.0.1", "10.9.0.77", "::ffff:10.9.0.77"} {
		if id, ok := g.Owner(netip.MustParseAddr(a)); ok {
			t.Errorf("Owner(%s) = %s", a, id)
		}
	}
	if id, ok := g.Owner(netip.MustParseAddr("::ffff:10.9.0.5")); !ok || id != "vm-a" {
		t.Errorf("Owner of the IPv4-mapped address = %q %v", id, ok)
	}
	taps := g.Taps()
	if len(taps) != 2 || taps[0].State != Guarded || taps[1].State != Failed {
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
	h.mu.Lock()
	h.loading = func() {
		_, ok := g.Owner(addrA)
		trustedWhileLoading <- ok
	}
	h.mu.Unlock()
	go g.Run(ctx, Interval)
	loaded, _ := h.count(ctx)
	h.ns.Run("nft", "flush", "table", "bridge", "bcd_instances")
	flushed := time.Now()
	if n, _ := h.count(ctx); n >= loaded {
		t.Fatalf("after the flush %d rules, before %d", n, loaded)
	}
	for {
		if n, _ := h.count(ctx); n == loaded {
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
