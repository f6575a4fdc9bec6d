package gateway_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/boot/bootlease"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

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
