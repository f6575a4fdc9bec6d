package gateway_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// writeKEK writes a new key-encryption key file (0600) in a temp dir and
// returns its path and contents.
func writeKEK(t *testing.T) (string, []byte) {
	t.Helper()
	_, file, err := kek.Generate()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kek")
	if err := os.WriteFile(p, file, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, file
}

// keyFilesIn lists the files of the shared key set found in dir.
func keyFilesIn(t *testing.T, dir string) []string {
	t.Helper()
	var found []string
	for _, name := range keys.SharedFiles {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			found = append(found, name)
		}
	}
	return found
}

// Two gateways on one PostgreSQL database: a node joined through one holds
// its session on the other; a command sent through the first reaches it
// (a notice, not a poll), its result sent to the second wakes an admin
// call waiting on the first, a cancel through the first reaches the
// session on the second, and a newer session of the node on the first
// ends the one on the second.
func TestTwoGatewaysShareOneDatabase(t *testing.T) {
	g1, g2 := twoGateways(t, gateway.Config{})
	d1 := g1.dir

	a := g1.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, f, err := openSession(t, ctx, g2.client(t, certOf(a)), a.NodeID)
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("session on the second gateway: %v %v", f, err)
	}
	waitFor(t, "the session on the second gateway", func() bool { return g2.s.Connected(a.NodeID) })
	if g1.s.Connected(a.NodeID) {
		t.Fatal("the first gateway claims the session")
	}

	// A command may come twice (the Welcome's replay and its notice, or
	// the sweep): the agent keys on its id. recv skips repeats.
	seen := map[string]bool{}
	recv := func() (*bcdv1.GatewayFrame, error) {
		for {
			f, err := st.Receive()
			if err != nil || f.GetCommand() == nil || !seen[f.GetCommand().GetId()] {
				if f.GetCommand() != nil {
					seen[f.GetCommand().GetId()] = true
				}
				return f, err
			}
		}
	}
	sent := time.Now()
	cmd, err := g1.s.SendCommand(a.NodeID, "k.routed", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f, err = recv()
	if err != nil || f.GetCommand().GetId() != cmd.ID {
		t.Fatalf("on the second gateway's session: %v %v, want command %s", f, err, cmd.ID)
	}
	// Well under the sweep's 5 s: the notice brought it.
	if d := time.Since(sent); d > 3*time.Second {
		t.Errorf("the command took %s to reach the other gateway's session", d)
	}
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Ack{Ack: &bcdv1.Ack{CommandIds: []string{cmd.ID}}}}); err != nil {
		t.Fatal(err)
	}

	// An admin call on the first gateway waits; the result arrives on the
	// second and wakes it.
	type res struct {
		v   adminapi.CommandView
		err error
		at  time.Time
	}
	woke := make(chan res, 1)
	go func() {
		v, err := adminapi.NewClient(d1, "", "").Command(ctx, cmd.ID, 20*time.Second)
		woke <- res{v, err, time.Now()}
	}()
	time.Sleep(300 * time.Millisecond)
	resultAt := time.Now()
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: cmd.ID, Status: "SUCCEEDED"}}}); err != nil {
		t.Fatal(err)
	}
	if f, err = recv(); err != nil || f.GetAck() == nil {
		t.Fatalf("after the result: %v %v", f, err)
	}
	select {
	case r := <-woke:
		if r.err != nil || r.v.State != "done" || r.v.Status != "SUCCEEDED" || r.v.ResultCopies != 1 {
			t.Errorf("the waiting admin call: %+v %v", r.v, r.err)
		}
		if d := r.at.Sub(resultAt); d > 3*time.Second {
			t.Errorf("the waiter on the other gateway woke %s after the result", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the admin call on the first gateway did not wake")
	}

	// A delivered command cancelled through the first gateway: the Cancel
	// reaches the session on the second.
	c2, err := g1.s.SendCommand(a.NodeID, "k.long", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if f, err = recv(); err != nil || f.GetCommand().GetId() != c2.ID {
		t.Fatalf("second command: %v %v", f, err)
	}
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Ack{Ack: &bcdv1.Ack{CommandIds: []string{c2.ID}}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ack", func() bool { x, _ := g1.s.Store().Command(c2.ID); return x.State == "delivered" })
	if _, err := g1.s.CancelCommand(c2.ID, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	if f, err = recv(); err != nil || f.GetCancel().GetCommandId() != c2.ID || f.GetCancel().GetReason() != "changed my mind" {
		t.Fatalf("after the cancel: %v %v", f, err)
	}

	// The node dials the first gateway: its session there is newer, and the
	// one on the second gateway ends.
	st1, f, err := openSession(t, ctx, g1.client(t, certOf(a)), a.NodeID)
	if err != nil || f.GetWelcome().GetEpoch() != 2 {
		t.Fatalf("session on the first gateway: %v %v", f, err)
	}
	_ = st1
	waitFor(t, "the old session to end", func() bool { return !g2.s.Connected(a.NodeID) && g1.s.Connected(a.NodeID) })
}

// twoGateways starts two gateways on one fresh database of a cluster of
// their own, given one key-encryption key and no key files: the second
// takes the keys the first stored in the database. Both listen for
// notices.
func twoGateways(t *testing.T, cfg gateway.Config) (*gw, *gw) {
	t.Helper()
	g1, g2, _ := twoGatewaysOn(t, cfg)
	return g1, g2
}

// twoGatewaysOn is twoGateways that also returns the second gateway's
// configuration (its database and key-encryption key), for a third.
func twoGatewaysOn(t *testing.T, cfg gateway.Config) (*gw, *gw, gateway.Config) {
	t.Helper()
	c := pgtest.StartT(t)
	url, err := c.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := filepath.Join(t.TempDir(), "gw1"), filepath.Join(t.TempDir(), "gw2")
	cfg.KEKFile, _ = writeKEK(t)
	cfg.Database, cfg.DataDir = url, d1
	g1 := startGateway(t, cfg)
	cfg.DataDir = d2
	g2 := startGateway(t, cfg)
	for _, d := range []string{d1, d2} {
		if f := keyFilesIn(t, d); len(f) > 0 {
			t.Fatalf("key files in %s: %v", d, f)
		}
	}
	for _, g := range []*gw{g1, g2} {
		waitFor(t, "the notice listener", func() bool { return strings.Contains(g.logs.String(), "listening for the other gateways' notices") })
	}
	return g1, g2, cfg
}

// A site's boot lease is one row for both gateways: of two site agents,
// each on another gateway, one holds it; when its session ends, the other
// gateway hands it to the other agent once it expired.
func TestSiteLeaseAcrossGateways(t *testing.T) {
	g1, g2 := twoGateways(t, gateway.Config{LeaseTTL: time.Second})
	a, b := g1.joinRole(t, "site"), g1.joinRole(t, "site")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	actx, acancel := context.WithCancel(ctx)
	sta := g1.agentSession(t, actx, a, &bcdv1.Hello{})
	if l, _ := leaseOf(t, recvDesired(t, sta).GetSpec()); !l.Held {
		t.Fatal("a does not hold the lease")
	}
	stb := g2.agentSession(t, ctx, b, &bcdv1.Hello{})
	if l, _ := leaseOf(t, recvDesired(t, stb).GetSpec()); l.Held {
		t.Fatal("b, on the other gateway, holds the lease too")
	}
	acancel()
	_ = sta.CloseRequest()
	_ = sta.CloseResponse()
	waitFor(t, "a's session to end", func() bool { return !g1.s.Connected(a.NodeID) })
	for {
		ds := recvDesired(t, stb)
		if l, _ := leaseOf(t, ds.GetSpec()); l.Held {
			break
		}
	}
}

// A trust root added through one gateway reaches the other: it holds the
// new bundle (its Welcomes carry it) and drains its sessions to take it; a
// second change through the other gateway starts from it.
func TestTrustAcrossGateways(t *testing.T) {
	g1, g2 := twoGateways(t, gateway.Config{})
	a := g2.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, f, err := openSession(t, ctx, g2.client(t, certOf(a)), a.NodeID)
	if err != nil || f.GetWelcome().GetTrustBundle().GetVersion() != 1 {
		t.Fatalf("session on the second gateway: %v %v", f, err)
	}
	k1, _ := pki.GenerateKey()
	ch, err := g1.s.AddTrustRoot(spkiOf(t, k1))
	if err != nil || ch.Version != 2 {
		t.Fatalf("add a root on the first gateway: %+v %v", ch, err)
	}
	waitFor(t, "the second gateway to hold version 2", func() bool { return g2.s.TrustBundle().GetVersion() == 2 })
	for {
		f, err := st.Receive()
		if err != nil {
			t.Fatalf("before a Drain: %v", err)
		}
		if f.GetDrain() != nil {
			break
		}
	}
	k2, _ := pki.GenerateKey()
	if ch, err := g2.s.AddTrustRoot(spkiOf(t, k2)); err != nil || ch.Version != 3 || ch.Roots != 3 {
		t.Fatalf("add a root on the second gateway: %+v %v", ch, err)
	}
	waitFor(t, "the first gateway to hold version 3", func() bool { return g1.s.TrustBundle().GetVersion() == 3 })
}

// Trust roots added through both gateways at the same moment: every one
// of them ends in the bundle, each change its own version. Each change
// writes its version only over the bundle it started from (SwapMeta); a
// gateway that lost the race applies its change again to the winner's.
func TestTrustChangesAtOnceAcrossGateways(t *testing.T) {
	g1, g2 := twoGateways(t, gateway.Config{})
	const each = 4
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	var pins []string
	var mu sync.Mutex
	for i := range 2 * each {
		g := []*gw{g1, g2}[i%2]
		k, err := pki.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		spki := spkiOf(t, k)
		wg.Go(func() {
			ch, err := g.s.AddTrustRoot(spki)
			if err == nil && !ch.Changed {
				err = fmt.Errorf("root %s: not added", ch.Pin)
			}
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			pins = append(pins, ch.Pin)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("add a root: %v", err)
	}
	want := uint64(1 + 2*each)
	waitFor(t, "both gateways to hold the last version", func() bool {
		return g1.s.TrustBundle().GetVersion() == want && g2.s.TrustBundle().GetVersion() == want
	})
	for _, g := range []*gw{g1, g2} {
		v, err := g.s.Trust()
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, r := range v.Roots {
			have[r.Pin] = true
		}
		for _, p := range pins {
			if !have[p] {
				t.Errorf("root %s missing from version %d (%d roots)", p, v.Version, len(v.Roots))
			}
		}
	}
}
