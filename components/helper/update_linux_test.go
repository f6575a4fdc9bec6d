//go:build linux

package helper

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/release"
	"github.com/better-compute/bcd/components/trust/selfupdate"
)

// updHelper is a helper serving update.* over dir/slots, with the node's
// data in dir/data, a clock the test moves, and a caller that "runs"
// whatever binary runs names (its /proc/PID/exe as the helper sees it).
type updHelper struct {
	*testHelper
	slots, staging string
	keys           []crypto.Signer
	pins           []string
	clock          *testClock
	runs           atomic.Value // string: the binary the caller runs ("": the test binary)
	asNode         atomic.Bool  // the caller's uid is the [helper] user's, not root's
	mu             sync.Mutex
	systemctl      []string
	inst           selfupdate.Installer
}

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// startUpdHelper starts a helper with two release keys, threshold 2,
// whose slots adopt dir/bin/bcd ("bcd 0.1.0") at the first update.
func startUpdHelper(t *testing.T, mod func(*updHelper, *Config, *seams)) *updHelper {
	t.Helper()
	u := &updHelper{clock: &testClock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}}
	u.runs.Store("")
	for range 2 {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		spki, _ := x509.MarshalPKIXPublicKey(k.Public())
		sum := sha256.Sum256(spki)
		u.keys = append(u.keys, k)
		u.pins = append(u.pins, pki.PinPrefix+base64.StdEncoding.EncodeToString(sum[:]))
	}
	u.testHelper = startHelper(t, func(c *Config, s *seams) {
		u.slots = filepath.Join(s.top, "slots")
		data := filepath.Join(s.top, "data")
		u.staging = filepath.Join(data, selfupdate.StagingDir)
		bin := filepath.Join(s.top, "bin", "bcd")
		must(t, os.MkdirAll(filepath.Dir(bin), 0o755))
		must(t, os.WriteFile(bin, []byte("bcd 0.1.0"), 0o755))
		must(t, os.MkdirAll(u.staging, 0o700))
		uid, _, _ := s.lookupUser("bcd")
		must(t, os.Chown(u.staging, int(uid), -1))
		c.Update = UpdateConfig{Pins: u.pins, Threshold: 2, SlotsDir: u.slots, DataDir: data, Adopt: bin}
		s.now = u.clock.now
		s.watchdogPoll = 10 * time.Millisecond
		s.peer = func(c *net.UnixConn) (peerCred, error) {
			p, err := socketPeer(c)
			if u.asNode.Load() {
				uid, gid, _ := s.lookupUser("bcd")
				p.uid, p.gid = uid, gid
			}
			return p, err
		}
		s.exe = func(c *net.UnixConn, pid int32) (os.FileInfo, error) {
			if p := u.runs.Load().(string); p != "" {
				return os.Stat(p)
			}
			return peerExe(c, pid)
		}
		s.systemctl = func(_ context.Context, args ...string) ([]byte, error) {
			u.mu.Lock()
			u.systemctl = append(u.systemctl, strings.Join(args, " "))
			u.mu.Unlock()
			return nil, nil
		}
		if mod != nil {
			mod(u, c, s)
		}
	})
	u.inst = u.client.Updater()
	return u
}

func (u *updHelper) restarts() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.systemctl)
}

// release makes release version at seq signed by the first n keys, its
// node binary "bcd VERSION" for this machine's architecture.
func (u *updHelper) release(t *testing.T, version string, seq uint64, n int) ([]byte, []byte) {
	t.Helper()
	bin := []byte("bcd " + version)
	sum := sha256.Sum256(bin)
	m := release.Manifest{Type: release.Type, Version: version, Sequence: seq, Expires: u.clock.now().Add(30 * 24 * time.Hour),
		Artifacts: []release.Artifact{{Role: "node", Arch: runtime.GOARCH, Size: int64(len(bin)), SHA256: hex.EncodeToString(sum[:]), URL: "https://r.example/" + version}}}
	doc, err := release.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range u.keys[:n] {
		if doc, err = release.Sign(doc, k); err != nil {
			t.Fatal(err)
		}
	}
	return doc, bin
}

// stage writes bin as the node would: the staged name, owned by the
// [helper] user, one link.
func (u *updHelper) stage(t *testing.T, version string, bin []byte) string {
	t.Helper()
	p := filepath.Join(u.staging, selfupdate.StagedName(version))
	must(t, os.WriteFile(p, bin, 0o600))
	must(t, os.Chown(p, int(u.uid), int(u.gid)))
	return p
}

// state reads the slots as the helper keeps them, not through it.
func (u *updHelper) state(t *testing.T) (selfupdate.Record, string, *selfupdate.Upgrade) {
	t.Helper()
	r, cur, up, err := (&selfupdate.Slots{Dir: u.slots}).Read()
	if err != nil {
		t.Fatal(err)
	}
	return r, cur, up
}

// upgrade prepares, stages and swaps to version at seq.
func (u *updHelper) upgrade(t *testing.T, version string, seq uint64) selfupdate.Upgrade {
	t.Helper()
	ctx := context.Background()
	doc, bin := u.release(t, version, seq, 2)
	p, err := u.inst.Prepare(ctx, doc)
	if err != nil {
		t.Fatalf("prepare %s: %v", version, err)
	}
	u.stage(t, version, bin)
	_ = p
	up, err := u.inst.Swap(ctx, doc)
	if err != nil {
		t.Fatalf("swap %s: %v", version, err)
	}
	return up
}

// TestUpdateThroughHelper: a release signed in the test is prepared,
// staged by the node, swapped in by the helper (which adopts the
// installed binary first) and confirmed by the new binary; the floor
// rises, and the old release is refused as final from then on.
func TestUpdateThroughHelper(t *testing.T) {
	u := startUpdHelper(t, nil)
	ctx := context.Background()
	st, err := u.inst.Status(ctx)
	if err != nil || st.Initialized {
		t.Fatalf("status before any update: %+v %v", st, err)
	}
	doc, bin := u.release(t, "0.2.0", 2, 2)
	p, err := u.inst.Prepare(ctx, doc)
	if err != nil {
		t.Fatal(err)
	}
	if p.Version != "0.2.0" || p.Sequence != 2 || p.Staged != "bcd-0.2.0" || p.Artifact.Arch != runtime.GOARCH {
		t.Errorf("prepared %+v", p)
	}
	staged := u.stage(t, "0.2.0", bin)
	up, err := u.inst.Swap(ctx, doc)
	if err != nil {
		t.Fatal(err)
	}
	if up.From != selfupdate.SlotA || up.To != selfupdate.SlotB || !up.Deadline.Equal(u.clock.now().Add(selfupdate.ConfirmWindow)) {
		t.Errorf("swap %+v", up)
	}
	if _, err := os.Lstat(staged); !os.IsNotExist(err) {
		t.Errorf("the staged file is left after the swap: %v", err)
	}
	for slot, want := range map[string]string{selfupdate.SlotA: "bcd 0.1.0", selfupdate.SlotB: "bcd 0.2.0", selfupdate.Current: "bcd 0.2.0"} {
		if b, err := os.ReadFile(filepath.Join(u.slots, slot)); err != nil || string(b) != want {
			t.Errorf("%s holds %q (%v), want %q", slot, b, err, want)
		}
	}
	fi, _ := os.Stat(filepath.Join(u.slots, selfupdate.SlotB))
	if !ownedBy(fi, os.Geteuid()) || fi.Mode().Perm() != 0o755 {
		t.Errorf("slot b is %s, owned by %v", fi.Mode(), fi.Sys())
	}
	// The new binary (the caller runs slot b) confirms.
	u.runs.Store(filepath.Join(u.slots, selfupdate.SlotB))
	if ok, err := u.inst.Confirm(ctx); !ok || err != nil {
		t.Fatalf("confirm: %v %v", ok, err)
	}
	st, err = u.inst.Status(ctx)
	if err != nil || st.Floor != 2 || st.Pending != nil || st.Current != selfupdate.SlotB || st.Slots[selfupdate.SlotB].Version != "0.2.0" {
		t.Errorf("status after confirm: %+v %v", st, err)
	}
	// Release 1, signed correctly, is below the floor: final.
	old, _ := u.release(t, "0.1.5", 1, 2)
	var f *release.FinalError
	if _, err := u.inst.Prepare(ctx, old); !errors.As(err, &f) || !strings.Contains(err.Error(), "floor") {
		t.Errorf("a release below the floor: %v, want a final refusal naming the floor", err)
	}
	if got := u.restarts(); len(got) != 0 {
		t.Errorf("systemctl ran: %v", got)
	}
}

// TestUpdateRefusesStagedFiles: the helper takes the staged download only
// as a regular file with one link owned by the node's user; each refusal
// leaves the slots as they were.
func TestUpdateRefusesStagedFiles(t *testing.T) {
	u := startUpdHelper(t, nil)
	ctx := context.Background()
	doc, bin := u.release(t, "0.2.0", 2, 2)
	if _, err := u.inst.Prepare(ctx, doc); err != nil { // adopts into slot a
		t.Fatal(err)
	}
	elsewhere := filepath.Join(u.dir, "elsewhere")
	must(t, os.WriteFile(elsewhere, bin, 0o600))
	must(t, os.Chown(elsewhere, int(u.uid), int(u.gid)))
	staged := filepath.Join(u.staging, selfupdate.StagedName("0.2.0"))
	for _, tt := range []struct {
		name, want string
		make       func()
	}{
		{"a symlink", "opening the staged file", func() { must(t, os.Symlink(elsewhere, staged)) }},
		{"two links", "2 links, want 1", func() { must(t, os.Link(elsewhere, staged)) }},
		{"another owner", "owned by uid", func() {
			u.stage(t, "0.2.0", bin)
			must(t, os.Chown(staged, int(u.uid)+1, int(u.gid)))
		}},
		{"a directory", "not a regular file", func() { must(t, os.Mkdir(staged, 0o700)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			os.RemoveAll(staged)
			tt.make()
			before := snapshot(t, u.slots)
			_, err := u.inst.Swap(ctx, doc)
			var f *release.FinalError
			if err == nil || !strings.Contains(err.Error(), tt.want) || errors.As(err, &f) {
				t.Errorf("swap of %s: %v, want a refusal containing %q, not final", tt.name, err, tt.want)
			}
			sameSnapshot(t, before, snapshot(t, u.slots))
		})
	}
}

// TestUpdateFinalThroughTheWire: a manifest signed by one key of the two
// the helper needs is refused as final, and the client gives back a
// *release.FinalError; nothing is swapped.
func TestUpdateFinalThroughTheWire(t *testing.T) {
	u := startUpdHelper(t, nil)
	ctx := context.Background()
	doc, bin := u.release(t, "0.2.0", 2, 1)
	u.stage(t, "0.2.0", bin)
	for _, call := range []func() error{
		func() error { _, err := u.inst.Prepare(ctx, doc); return err },
		func() error { _, err := u.inst.Swap(ctx, doc); return err },
	} {
		err := call()
		var f *release.FinalError
		var he *helperclient.Error
		if !errors.As(err, &f) || !errors.As(err, &he) || !strings.Contains(err.Error(), "release manifest refused: bcd helper: update.") || !strings.Contains(err.Error(), "1 of the pinned keys; 2 must sign") {
			t.Errorf("below the threshold: %v (%T), want a *release.FinalError from the helper", err, err)
		}
	}
	// On the wire itself: final, not retryable.
	req, _ := wire.EncodeRequest(&wire.Request{V: wire.Version, Op: wire.OpUpdatePrepare, Document: doc})
	if got := u.raw(t, req); !strings.Contains(got, `"retryable":false,"final":true`) {
		t.Errorf("the answer on the wire: %s", got)
	}
	if _, err := os.Lstat(filepath.Join(u.slots, selfupdate.SlotB)); !os.IsNotExist(err) {
		t.Errorf("slot b exists after refusals: %v", err)
	}
	// A document over the bound is refused before it is sent.
	if _, err := u.inst.Prepare(ctx, make([]byte, release.MaxDocument+1)); err == nil {
		t.Error("a document over release.MaxDocument was sent")
	}
}

// TestUpdateNodeClaims: what a node claims moves neither the floor nor
// the failed list. It confirms while current is not the pending slot (the
// record is made to say so), confirms from the old binary, settles before
// the deadline, and asks for a rollback; each is refused or does nothing.
func TestUpdateNodeClaims(t *testing.T) {
	u := startUpdHelper(t, nil)
	ctx := context.Background()
	up := u.upgrade(t, "0.2.0", 2)
	check := func(what string) {
		t.Helper()
		r, cur, pending := u.state(t)
		if r.Floor != 0 || len(r.Failed) != 0 || cur != selfupdate.SlotB || pending == nil || *pending != up {
			t.Errorf("after %s: floor %d, failed %v, current %s, pending %+v", what, r.Floor, r.Failed, cur, pending)
		}
	}
	// The old binary (slot a, still running until the restart) confirms.
	u.runs.Store(filepath.Join(u.slots, selfupdate.SlotA))
	if ok, err := u.inst.Confirm(ctx); ok || err == nil || !strings.Contains(err.Error(), "only the new binary confirms") {
		t.Errorf("confirm from the old binary: %v %v", ok, err)
	}
	check("confirm from the old binary")
	// Settle before the deadline does nothing.
	u.clock.add(selfupdate.ConfirmWindow - time.Second)
	if back, err := u.inst.Settle(ctx); back != "" || err != nil {
		t.Errorf("settle before the deadline: %q %v", back, err)
	}
	check("settle before the deadline")
	// Rollback is root's.
	if back, err := u.inst.Rollback(ctx); back != "" || err == nil || !strings.Contains(err.Error(), "not served to the node") {
		t.Errorf("rollback from the node: %q %v", back, err)
	}
	check("rollback from the node")
	// A process running anything else is not let in at all.
	u.runs.Store(filepath.Join(u.dir, "bin", "bcd-other"))
	must(t, os.WriteFile(filepath.Join(u.dir, "bin", "bcd-other"), []byte("x"), 0o755))
	if _, err := u.inst.Confirm(ctx); err == nil || !strings.Contains(err.Error(), notAllowed) {
		t.Errorf("confirm from another binary: %v", err)
	}
	check("confirm from another binary")
	// Current moved back to slot a behind the record's back: the new
	// binary's confirm is refused (current is not the pending slot).
	u.runs.Store(filepath.Join(u.slots, selfupdate.SlotB))
	tmp := filepath.Join(u.slots, ".test-link")
	must(t, os.Symlink(selfupdate.SlotA, tmp))
	must(t, os.Rename(tmp, filepath.Join(u.slots, selfupdate.Current)))
	if ok, err := u.inst.Confirm(ctx); ok || err == nil {
		t.Errorf("confirm while current is not the pending slot: %v %v", ok, err)
	}
	if r, _, pending := u.state(t); r.Floor != 0 || len(r.Failed) != 0 || pending == nil {
		t.Errorf("after a confirm with current elsewhere: floor %d failed %v pending %v", r.Floor, r.Failed, pending)
	}
}

// TestUpdateWatchdog: an upgrade still unconfirmed 30 s past its
// deadline is swapped back by the helper, recorded failed, and bcd.service
// restarted, whatever the node does; not a moment before. A helper that
// starts with such an upgrade on disk does it at once.
func TestUpdateWatchdog(t *testing.T) {
	u := startUpdHelper(t, nil)
	u.upgrade(t, "0.2.0", 2)
	u.clock.add(selfupdate.ConfirmWindow + watchdogGrace - time.Second)
	time.Sleep(100 * time.Millisecond)
	if _, cur, up := u.state(t); cur != selfupdate.SlotB || up == nil || len(u.restarts()) != 0 {
		t.Fatalf("the watchdog acted before the deadline + 30 s: current %s pending %v restarts %v", cur, up, u.restarts())
	}
	u.clock.add(time.Second)
	waitFor(t, func() bool { return len(u.restarts()) > 0 })
	r, cur, up := u.state(t)
	if cur != selfupdate.SlotA || up != nil || !slices.Equal(r.Failed, []string{"0.2.0"}) || r.Floor != 0 {
		t.Errorf("after the watchdog: current %s pending %v failed %v floor %d", cur, up, r.Failed, r.Floor)
	}
	if got := u.restarts(); !reflect.DeepEqual(got, []string{"restart bcd.service"}) {
		t.Errorf("systemctl calls %v", got)
	}

	// Re-armed at start: a second helper on the same slots, with a pending
	// upgrade already past due.
	// The first helper's watchdog sleeps for real (no poll), so only the
	// second one's check at its start can act within the test.
	u2 := startUpdHelper(t, func(_ *updHelper, _ *Config, s *seams) { s.watchdogPoll = 0 })
	u2.upgrade(t, "0.3.0", 3)
	u3 := startUpdHelper(t, func(n *updHelper, c *Config, s *seams) {
		s.top, c.Socket = u2.dir, filepath.Join(u2.dir, "run3", "h.sock")
		c.Update.SlotsDir = u2.slots
		n.clock.add(time.Hour)
		s.watchdogPoll = 0
	})
	waitFor(t, func() bool { return len(u3.restarts()) > 0 })
	if r, cur, up := u2.state(t); cur != selfupdate.SlotA || up != nil || !slices.Contains(r.Failed, "0.3.0") {
		t.Errorf("after a restarted helper's watchdog: current %s pending %v failed %v", cur, up, r.Failed)
	}
}

// TestUpdateRollbackCommand: bcd-helper update-rollback (root's) swaps
// back the pending upgrade, records it failed and restarts bcd.service;
// with nothing pending it does nothing.
func TestUpdateRollbackCommand(t *testing.T) {
	u := startUpdHelper(t, nil)
	u.upgrade(t, "0.2.0", 2)
	var cfg Config
	var s seams
	startUpdHelperConfig(u, &cfg, &s)
	back, err := rollbackNow(context.Background(), cfg, s, true)
	if back != "0.2.0" || err != nil {
		t.Fatalf("rollback: %q %v", back, err)
	}
	r, cur, up := u.state(t)
	if cur != selfupdate.SlotA || up != nil || !slices.Equal(r.Failed, []string{"0.2.0"}) {
		t.Errorf("after update-rollback: current %s pending %v failed %v", cur, up, r.Failed)
	}
	if got := u.restarts(); !reflect.DeepEqual(got, []string{"reset-failed bcd.service", "--no-block restart bcd.service"}) {
		t.Errorf("systemctl calls %v", got)
	}
	if back, err := rollbackNow(context.Background(), cfg, s, true); back != "" || err != nil {
		t.Errorf("rollback with nothing pending: %q %v", back, err)
	}
}

// startUpdHelperConfig is the configuration and seams u's helper runs
// with, for a second process on the same slots.
func startUpdHelperConfig(u *updHelper, cfg *Config, s *seams) {
	*s, _, _ = testSeams(u.dir)
	s.now = u.clock.now
	s.systemctl = func(_ context.Context, args ...string) ([]byte, error) {
		u.mu.Lock()
		u.systemctl = append(u.systemctl, strings.Join(args, " "))
		u.mu.Unlock()
		return nil, nil
	}
	*cfg = Config{Update: UpdateConfig{Pins: u.pins, Threshold: 2, SlotsDir: u.slots, DataDir: filepath.Join(u.dir, "data")}}
}

// TestUpdateStartRefusals: the helper does not start with its slots in
// the node's data directory, or around it.
func TestUpdateStartRefusals(t *testing.T) {
	dir := t.TempDir()
	s, _, _ := testSeams(dir)
	for _, tt := range []struct{ slots, data string }{
		{filepath.Join(dir, "data", "bin"), filepath.Join(dir, "data")},
		{filepath.Join(dir, "data"), filepath.Join(dir, "data")},
		{dir, filepath.Join(dir, "data")},
	} {
		cfg := Config{Socket: filepath.Join(dir, "run", "h.sock"), User: "bcd",
			Update: UpdateConfig{Pins: []string{pki.PinPrefix + strings.Repeat("A", 43) + "="}, Threshold: 1, SlotsDir: tt.slots, DataDir: tt.data}}
		if _, err := start(cfg, nil, s); err == nil || !strings.Contains(err.Error(), "overlaps data_dir") {
			t.Errorf("slots %s, data %s: %v", tt.slots, tt.data, err)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("timed out")
}

// TestUpdateFloorFromTheInstalledRelease: the helper adopts the installed
// binary at the installed package's release sequence, the floor from the
// first update on: an older release, signed and unexpired, is refused as
// final; a release at the floor's own sequence is not swapped in (it
// would have run unconfirmed once update.settle took the floor for its
// confirmation); a newer one is.
func TestUpdateFloorFromTheInstalledRelease(t *testing.T) {
	u := startUpdHelper(t, func(_ *updHelper, c *Config, _ *seams) { c.Update.AdoptSequence = 5 })
	ctx := context.Background()
	var f *release.FinalError
	older, bin := u.release(t, "0.0.9", 4, 2)
	u.stage(t, "0.0.9", bin)
	if _, err := u.inst.Prepare(ctx, older); !errors.As(err, &f) || !strings.Contains(err.Error(), "below the release floor 5") {
		t.Errorf("prepare of an older release: %v, want a final refusal naming the floor", err)
	}
	if _, err := u.inst.Swap(ctx, older); !errors.As(err, &f) || !strings.Contains(err.Error(), "below the release floor 5") {
		t.Errorf("swap to an older release: %v, want a final refusal naming the floor", err)
	}
	equal, bin := u.release(t, "0.1.1", 5, 2)
	u.stage(t, "0.1.1", bin)
	if _, err := u.inst.Swap(ctx, equal); !errors.As(err, &f) || !strings.Contains(err.Error(), "is not above the release floor 5") {
		t.Errorf("swap to another release at the floor: %v, want a final refusal", err)
	}
	// Settle has nothing to take for confirmed.
	if back, err := u.inst.Settle(ctx); back != "" || err != nil {
		t.Errorf("settle: %q %v", back, err)
	}
	r, cur, pending := u.state(t)
	if r.Floor != 5 || cur != selfupdate.SlotA || pending != nil || r.Slots[selfupdate.SlotA].Sequence != 5 {
		t.Errorf("after the refusals: floor %d, current %s, pending %+v, slots %+v", r.Floor, cur, pending, r.Slots)
	}
	if up := u.upgrade(t, "0.2.0", 6); up.Sequence != 6 || up.To != selfupdate.SlotB {
		t.Errorf("a newer release: %+v", up)
	}
}

// TestUpdateClearFailedIsRoots: update.clear_failed from the node's uid is
// refused and the failed versions stay; root (bcd update --clear-failed)
// clears them.
func TestUpdateClearFailedIsRoots(t *testing.T) {
	u := startUpdHelper(t, nil)
	ctx := context.Background()
	u.upgrade(t, "0.2.0", 2)
	if _, err := u.inst.Rollback(ctx); err == nil {
		t.Fatal("rollback from the node was served")
	}
	u.clock.add(selfupdate.ConfirmWindow + time.Second)
	if back, err := u.inst.Settle(ctx); back != "0.2.0" || err != nil {
		t.Fatalf("settle past the deadline: %q %v", back, err)
	}
	u.asNode.Store(true)
	if err := u.inst.ClearFailed(ctx); err == nil || !strings.Contains(err.Error(), "update.clear_failed is root's") {
		t.Errorf("clear_failed from the node: %v", err)
	}
	if r, _, _ := u.state(t); !slices.Equal(r.Failed, []string{"0.2.0"}) {
		t.Errorf("failed after the node's clear_failed: %v", r.Failed)
	}
	u.asNode.Store(false)
	if err := u.inst.ClearFailed(ctx); err != nil {
		t.Errorf("clear_failed from root: %v", err)
	}
	if r, _, _ := u.state(t); len(r.Failed) != 0 {
		t.Errorf("failed after root's clear_failed: %v", r.Failed)
	}
}
