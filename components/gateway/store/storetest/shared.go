package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
)

// OpenShared opens two stores on one fresh, empty database, as two
// gateways sharing it would (each implements store.Shared).
type OpenShared func(t testing.TB) (a, b store.Store)

// RunShared runs the cases several gateways on one store need: results,
// acks and events stored exactly once whichever gateway receives each
// copy, notices reaching every gateway, one holder of a lease. A backend
// one gateway owns (bbolt) has no such cases.
func RunShared(t *testing.T, open OpenShared) {
	for _, c := range []struct {
		name string
		f    func(*testing.T, store.Store, store.Store)
	}{
		{"ResultOnceAcrossGateways", testResultOnceAcross},
		{"AcksAcrossGateways", testAcksAcross},
		{"EventsOnceAcrossGateways", testEventsOnceAcross},
		{"NoticesReachEveryGateway", testNotices},
		{"PendingCommands", testPending},
		{"LeaseOneHolder", testLeaseOneHolder},
		{"ReleasesAcrossGateways", testReleasesAcross},
		{"OneKeySetAcrossGateways", testOneKeySet},
		{"OneResealAcrossGateways", testOneReseal},
		{"OneKeyRotationAcrossGateways", testOneKeyRotation},
		{"SwapMetaAcrossGateways", testSwapMetaAcross},
		{"UpdateMetaAcrossGateways", testUpdateMetaAcross},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := open(t)
			c.f(t, a, b)
		})
	}
}

func pick(a, b store.Store, i int) store.Store {
	if i%2 == 0 {
		return a
	}
	return b
}

// A node redials another gateway and sends its result again: of the
// copies sent to both gateways at once exactly one is stored, and every
// copy is counted.
func testResultOnceAcross(t *testing.T, a, b store.Store) {
	addNode(t, a, "n1")
	addCommand(t, a, "c1", "n1", t0)
	var mu sync.Mutex
	firsts := 0
	errs := race(racers, func(i int) error {
		first, err := pick(a, b, i).SetResult("n1", "c1", store.Result{Status: "SUCCEEDED", Output: []byte{byte(i)}})
		if first {
			mu.Lock()
			firsts++
			mu.Unlock()
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Errorf("result: %v", err)
		}
	}
	for _, s := range []store.Store{a, b} {
		c, err := s.Command("c1")
		if err != nil || c.State != store.StateDone || c.Result == nil || c.ResultCopies != racers {
			t.Errorf("command as read: %+v %v", c, err)
		}
	}
	if firsts != 1 {
		t.Errorf("%d copies stored as the first, want 1", firsts)
	}
}

// Acks of one command through both gateways deliver it once, and an ack
// arriving after the result (a late copy from the old gateway's session)
// leaves it done.
func testAcksAcross(t *testing.T, a, b store.Store) {
	addNode(t, a, "n1")
	addCommand(t, b, "c1", "n1", t0)
	for _, err := range race(racers, func(i int) error { return pick(a, b, i).MarkDelivered("n1", "c1") }) {
		if err != nil {
			t.Errorf("ack: %v", err)
		}
	}
	if c, _ := a.Command("c1"); c.State != store.StateDelivered {
		t.Errorf("after acks: %s", c.State)
	}
	if _, err := b.SetResult("n1", "c1", store.Result{Status: "SUCCEEDED"}); err != nil {
		t.Fatal(err)
	}
	if err := a.MarkDelivered("n1", "c1"); err != nil {
		t.Fatal(err)
	}
	if c, _ := b.Command("c1"); c.State != store.StateDone || c.Result == nil {
		t.Errorf("a late ack undid the result: %+v", c)
	}
	if un, _ := a.Unfinished("n1"); len(un) != 0 {
		t.Errorf("unfinished after the result: %v", ids(un))
	}
}

// The same events sent through both gateways at once (the agent resent
// what the dead gateway had not acked) are stored once each, in order.
func testEventsOnceAcross(t *testing.T, a, b store.Store) {
	addNode(t, a, "n1")
	const n = 20
	var mu sync.Mutex
	stored := map[uint64]int{}
	errs := race(racers, func(i int) error {
		for seq := uint64(1); seq <= n; seq++ {
			ok, err := pick(a, b, i).AddEvent("n1", store.Event{Seq: seq, Type: "t", AtUnixMS: int64(seq)}, 1000)
			if err != nil {
				return err
			}
			if ok {
				mu.Lock()
				stored[seq]++
				mu.Unlock()
			}
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Errorf("event: %v", err)
		}
	}
	evs, err := b.Events("n1", 0)
	if err != nil || len(evs) != n {
		t.Fatalf("events: %d %v, want %d", len(evs), err, n)
	}
	for i, e := range evs {
		if e.Seq != uint64(i+1) {
			t.Errorf("event %d has seq %d", i, e.Seq)
		}
	}
	// AddEvent answers whether the seq is stored (every copy says yes):
	// what counts is that the table holds each seq once.
	if len(stored) != n {
		t.Errorf("seqs answered stored: %d, want %d", len(stored), n)
	}
}

// A command stored through one gateway, its result and a notice sent
// through another reach a listener on either; a second copy of the result
// and a command id stored twice send nothing.
func testNotices(t *testing.T, a, b store.Store) {
	sa, sb := a.(store.Shared), b.(store.Shared)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan store.Notice, 16)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- sb.Listen(ctx, func(n store.Notice) { got <- n }, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("listen: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("listener not ready within 10s")
	}
	next := func(what string) store.Notice {
		t.Helper()
		select {
		case n := <-got:
			return n
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no notice within 5s", what)
			return store.Notice{}
		}
	}
	addNode(t, a, "n1")
	addCommand(t, a, "c1", "n1", t0)
	if n := next("command"); !reflect.DeepEqual(n, store.Notice{Kind: store.NoticeCommand, Node: "n1", Command: "c1"}) {
		t.Errorf("command notice: %+v", n)
	}
	if err := a.AddCommand(store.Command{ID: "c1", NodeID: "n1", Kind: "k", CreatedAt: t0}); err == nil {
		t.Error("a command id stored twice")
	}
	if _, err := a.SetResult("n1", "c1", store.Result{Status: "SUCCEEDED"}); err != nil {
		t.Fatal(err)
	}
	if n := next("result"); !reflect.DeepEqual(n, store.Notice{Kind: store.NoticeResult, Node: "n1", Command: "c1"}) {
		t.Errorf("result notice: %+v", n)
	}
	if _, err := a.SetResult("n1", "c1", store.Result{Status: "SUCCEEDED"}); err != nil {
		t.Fatal(err)
	}
	addCommand(t, a, "c2", "n1", t0.Add(time.Second))
	if n := next("second command"); n.Command != "c2" {
		t.Errorf("after a second result copy and a duplicate id, the next notice is %+v, want c2's command", n)
	}
	if _, done, err := b.CancelPending("c2", "stop", t0); err != nil || !done {
		t.Fatalf("cancel: %v %v", done, err)
	}
	if n := next("cancel"); !reflect.DeepEqual(n, store.Notice{Kind: store.NoticeResult, Node: "n1", Command: "c2"}) {
		t.Errorf("cancel's notice: %+v", n)
	}
	// A session started through one gateway tells the others its epoch,
	// once committed.
	started, err := a.StartSession("n1", func(*store.Node) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if n := next("session start"); !reflect.DeepEqual(n, store.Notice{Kind: store.NoticeSession, Node: "n1", Epoch: started.Epoch}) {
		t.Errorf("session start's notice: %+v, want epoch %d", n, started.Epoch)
	}
	want := store.Notice{Kind: store.NoticeSession, Node: "n1", Epoch: 7}
	if err := sa.Notify(want); err != nil {
		t.Fatal(err)
	}
	if n := next("session"); !reflect.DeepEqual(n, want) {
		t.Errorf("notice %+v, want %+v", n, want)
	}
	// A progress notice carries its detail as it is, and its time.
	want = store.Notice{Kind: store.NoticeProgress, Node: "n1", Command: "c2", Detail: json.RawMessage(`{"written":[1,2]}`), At: t0}
	if err := sa.Notify(want); err != nil {
		t.Fatal(err)
	}
	if n := next("progress"); string(n.Detail) != string(want.Detail) || !n.At.Equal(t0) || n.Command != "c2" {
		t.Errorf("notice %+v, want %+v", n, want)
	}
	// The largest detail a node may send (4 KiB), of the characters JSON
	// encoders like to escape, still fits in a notice.
	want.Detail = json.RawMessage(`"` + strings.Repeat("<&>", 4094/3) + `"`)
	if err := sa.Notify(want); err != nil {
		t.Fatalf("a notice with %d bytes of detail: %v", len(want.Detail), err)
	}
	if n := next("large progress"); string(n.Detail) != string(want.Detail) {
		t.Errorf("large detail: %d bytes back, want %d", len(n.Detail), len(want.Detail))
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("listen after its context ended: %v", err)
	}
}

// Pending lists commands not acked yet, oldest first, across nodes.
func testPending(t *testing.T, a, b store.Store) {
	addNode(t, a, "n1")
	addNode(t, a, "n2")
	addCommand(t, a, "c2", "n2", t0.Add(2*time.Second))
	addCommand(t, b, "c1", "n1", t0.Add(time.Second))
	addCommand(t, b, "c3", "n1", t0.Add(3*time.Second))
	if err := a.MarkDelivered("n1", "c3"); err != nil {
		t.Fatal(err)
	}
	p, err := b.(store.Shared).Pending([]string{"n1", "n2"}, 10)
	if err != nil || !equal(ids(p), []string{"c1", "c2"}) {
		t.Errorf("pending: %v %v, want [c1 c2]", ids(p), err)
	}
	if p, _ := a.(store.Shared).Pending([]string{"n1", "n2"}, 1); !equal(ids(p), []string{"c1"}) {
		t.Errorf("pending, limit 1: %v", ids(p))
	}
	// Only the nodes asked for: a gateway's sweep reads its sessions' commands.
	if p, _ := a.(store.Shared).Pending([]string{"n2", "n9"}, 10); !equal(ids(p), []string{"c2"}) {
		t.Errorf("pending for n2: %v", ids(p))
	}
	if p, err := a.(store.Shared).Pending(nil, 10); err != nil || len(p) != 0 {
		t.Errorf("pending for no node: %v %v", ids(p), err)
	}
}

// Of many gateways granting one free lease at once exactly one holder
// gets it; it renews, others wait for its expiry, then one takes it.
func testLeaseOneHolder(t *testing.T, a, b store.Store) {
	const ttl = 45 * time.Second
	// Held before and expired by t0: the racers find a row to take over.
	if h, _, _, err := a.(store.Shared).TouchLease("site/lab", "x", t0.Add(-ttl-time.Second), ttl); err != nil || !h {
		t.Fatalf("first grant: %v %v", h, err)
	}
	var mu sync.Mutex
	var held []int
	errs := race(racers, func(i int) error {
		h, _, changed, err := pick(a, b, i).(store.Shared).TouchLease("site/lab", string(rune('a'+i)), t0, ttl)
		if h {
			mu.Lock()
			held = append(held, i)
			mu.Unlock()
			if !changed {
				return errors.New("granted without a change")
			}
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Errorf("touch: %v", err)
		}
	}
	if len(held) != 1 {
		t.Fatalf("holders %v, want one", held)
	}
	owner := string(rune('a' + held[0]))
	other := "z"
	sa, sb := a.(store.Shared), b.(store.Shared)
	if h, until, changed, err := sb.TouchLease("site/lab", owner, t0.Add(10*time.Second), ttl); err != nil || !h || changed || !until.Equal(t0.Add(10*time.Second+ttl)) {
		t.Errorf("renewal: %v %v %v %v", h, until, changed, err)
	}
	if h, _, _, err := sa.TouchLease("site/lab", other, t0.Add(20*time.Second), ttl); err != nil || h {
		t.Errorf("another holder before expiry: %v %v", h, err)
	}
	if got, err := sa.LeaseHolder("site/lab", t0.Add(20*time.Second)); err != nil || got != owner {
		t.Errorf("holder: %q %v, want %q", got, err, owner)
	}
	late := t0.Add(10*time.Second + ttl + time.Second)
	if got, _ := sb.LeaseHolder("site/lab", late); got != "" {
		t.Errorf("holder after expiry: %q", got)
	}
	if h, _, changed, err := sa.TouchLease("site/lab", other, late, ttl); err != nil || !h || !changed {
		t.Errorf("taking an expired lease: %v %v %v", h, changed, err)
	}
	if got, _ := sb.LeaseHolder("missing", t0); got != "" {
		t.Errorf("a lease never granted has holder %q", got)
	}
}

// A release published through one gateway is read through the other;
// of two gateways publishing one version with different documents at
// once, exactly one wins and the other is ErrReleaseConflict; the same
// document again is no change.
func testReleasesAcross(t *testing.T, a, b store.Store) {
	ra, ok1 := a.(store.Releases)
	rb, ok2 := b.(store.Releases)
	if !ok1 || !ok2 {
		t.Fatal("a shared store must keep releases (store.Releases)")
	}
	if _, err := rb.Release("1.0.0"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Release before any: %v", err)
	}
	bin := []byte("\x7fELF bcd 1.0.0")
	if err := ra.PutRelease("1.0.0", []byte(`{"v":1}`), map[string][]byte{"aa": bin}); err != nil {
		t.Fatal(err)
	}
	if doc, err := rb.Release("1.0.0"); err != nil || string(doc) != `{"v":1}` {
		t.Errorf("Release through the other = %q, %v", doc, err)
	}
	if vs, err := rb.ReleaseVersions(); err != nil || len(vs) != 1 || vs[0] != "1.0.0" {
		t.Errorf("ReleaseVersions through the other = %v, %v", vs, err)
	}
	if got, err := rb.ReleaseArtifact("aa"); err != nil || !bytes.Equal(got, bin) {
		t.Errorf("ReleaseArtifact through the other = %q, %v", got, err)
	}
	if err := rb.PutRelease("1.0.0", []byte(`{"v":1}`), nil); err != nil {
		t.Errorf("the same document again: %v", err)
	}
	if err := rb.PutRelease("1.0.0", []byte(`{"v":2}`), map[string][]byte{"bb": bin}); !errors.Is(err, store.ErrReleaseConflict) {
		t.Errorf("another document: %v", err)
	}
	if _, err := ra.ReleaseArtifact("bb"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the refused release's binary was stored: %v", err)
	}
	oneWinner(t, "publishers of 2.0.0", func(i int) (bool, error) {
		err := pick(a, b, i).(store.Releases).PutRelease("2.0.0", []byte{byte('0' + i)}, nil)
		if errors.Is(err, store.ErrReleaseConflict) {
			return false, nil
		}
		return err == nil, err
	})
}

// Gateways starting together on an empty store each offer a key set:
// exactly one is stored, whole, and every gateway reads that one back
// (its fingerprint and every key); a later offer changes nothing.
func testOneKeySet(t *testing.T, a, b store.Store) {
	ka, oka := a.(store.KeyStore)
	kb, okb := b.(store.KeyStore)
	if !oka || !okb {
		t.Fatalf("a shared store that keeps no keys: %T", a)
	}
	if _, _, err := ka.Keys(); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("keys of an empty store: %v", err)
	}
	set := func(i int) (string, []store.SealedKey) {
		var ks []store.SealedKey
		for _, n := range []string{"a.key", "b.crt", "c.jwk"} {
			ks = append(ks, store.SealedKey{Name: n, Version: 1, Sealed: fmt.Appendf(nil, "sealed %s by %d\x00\xff", n, i)})
		}
		return fmt.Sprintf("fp-%d", i), ks
	}
	w := oneWinner(t, "key sets stored", func(i int) (bool, error) {
		fp, ks := set(i)
		return pick(ka.(store.Store), kb.(store.Store), i).(store.KeyStore).AddKeysIfAbsent(fp, ks)
	})
	wantFP, want := set(w)
	for _, k := range []store.KeyStore{ka, kb, ka} {
		fp, got, err := k.Keys()
		if err != nil || fp != wantFP || len(got) != len(want) {
			t.Fatalf("keys read: %s %d keys %v, want %s %d", fp, len(got), err, wantFP, len(want))
		}
		for i := range want {
			if got[i].Name != want[i].Name || got[i].Version != want[i].Version || !bytes.Equal(got[i].Sealed, want[i].Sealed) {
				t.Errorf("key %d: %+v, want %+v", i, got[i], want[i])
			}
		}
		fp, ks := set(99)
		if ok, err := k.AddKeysIfAbsent(fp, ks); ok || err != nil {
			t.Errorf("a later set: stored %v %v", ok, err)
		}
	}
}

// Two rotations of the key-encryption key from one fingerprint: exactly
// one reseals the set, whole; a set naming other keys than the stored
// ones changes nothing.
func testOneReseal(t *testing.T, a, b store.Store) {
	ka, kb := a.(store.KeyStore), b.(store.KeyStore)
	set := func(tag string, names ...string) []store.SealedKey {
		var ks []store.SealedKey
		for _, n := range names {
			ks = append(ks, store.SealedKey{Name: n, Version: 1, Sealed: []byte(tag + " " + n)})
		}
		return ks
	}
	if ok, err := ka.AddKeysIfAbsent("fp-old", set("old", "a.key", "b.key")); !ok || err != nil {
		t.Fatalf("first set: %v %v", ok, err)
	}
	if ok, err := ka.ResealKeys("fp-old", "fp-bad", set("bad", "a.key", "c.key")); ok || err == nil {
		t.Errorf("a set naming another key: %v %v", ok, err)
	}
	w := oneWinner(t, "reseals", func(i int) (bool, error) {
		return pick(a, b, i).(store.KeyStore).ResealKeys("fp-old", fmt.Sprintf("fp-%d", i), set(fmt.Sprint(i), "a.key", "b.key"))
	})
	for _, k := range []store.KeyStore{ka, kb} {
		fp, got, err := k.Keys()
		if err != nil || fp != fmt.Sprintf("fp-%d", w) || len(got) != 2 || string(got[1].Sealed) != fmt.Sprintf("%d b.key", w) {
			t.Fatalf("after the reseal: %s %+v %v", fp, got, err)
		}
	}
	if ok, err := kb.ResealKeys("fp-old", "fp-late", set("late", "a.key", "b.key")); ok || err != nil {
		t.Errorf("a reseal from a replaced fingerprint: %v %v", ok, err)
	}
}

// Two gateways rotating one key from one version at once: exactly one
// rotation is stored, its key and its meta value together; a rotation
// from a value, a version or a key-encryption key no longer stored
// changes nothing, and neither does a reseal of the key as it was before
// the rotation.
func testOneKeyRotation(t *testing.T, a, b store.Store) {
	ka := a.(store.KeyStore)
	key := func(v uint32, tag string) store.SealedKey {
		return store.SealedKey{Name: "cmd.key", Version: v, Sealed: []byte(tag)}
	}
	first := []store.SealedKey{{Name: "a.key", Version: 1, Sealed: []byte("a")}, key(1, "cmd 1")}
	if ok, err := ka.AddKeysIfAbsent("fp", first); !ok || err != nil {
		t.Fatalf("first set: %v %v", ok, err)
	}
	if err := a.SetMeta("bundle", []byte("b1")); err != nil {
		t.Fatal(err)
	}
	if ok, err := ka.RotateKey("fp", key(1, "same version"), "bundle", []byte("b1"), []byte("b?")); ok || err == nil {
		t.Errorf("a rotation to version 1: %v %v", ok, err)
	}
	w := oneWinner(t, "rotations", func(i int) (bool, error) {
		return pick(a, b, i).(store.KeyStore).RotateKey("fp", key(2, fmt.Sprint("cmd 2 by ", i)), "bundle", []byte("b1"), fmt.Appendf(nil, "b2 by %d", i))
	})
	check := func(when, version, bundle string) {
		t.Helper()
		for _, st := range []store.Store{a, b} {
			fp, got, err := st.(store.KeyStore).Keys()
			if err != nil || fp != "fp" || len(got) != 2 || string(got[0].Sealed) != "a" || fmt.Sprint(got[1].Version, " ", string(got[1].Sealed)) != version {
				t.Fatalf("%s: %s %+v %v, want cmd.key %q", when, fp, got, err, version)
			}
			if v, err := st.Meta("bundle"); err != nil || string(v) != bundle {
				t.Fatalf("%s: bundle %q %v, want %q", when, v, err, bundle)
			}
		}
	}
	won := fmt.Sprint("2 cmd 2 by ", w)
	wonBundle := fmt.Sprint("b2 by ", w)
	check("after the rotation", won, wonBundle)
	for _, c := range []struct {
		what    string
		fp      string
		next    store.SealedKey
		old     string
		changed string
	}{
		{"from a replaced bundle", "fp", key(3, "cmd 3"), "b1", ""},
		{"from a replaced version", "fp", key(2, "cmd 2 late"), wonBundle, ""},
		{"under another key-encryption key", "fp-other", key(3, "cmd 3"), wonBundle, ""},
	} {
		if ok, err := ka.RotateKey(c.fp, c.next, "bundle", []byte(c.old), []byte("b3")); ok || err != nil {
			t.Errorf("a rotation %s: %v %v", c.what, ok, err)
		}
		check("after a rotation "+c.what, won, wonBundle)
	}
	// A reseal read before the rotation (cmd.key at version 1) loses.
	stale := []store.SealedKey{{Name: "a.key", Version: 1, Sealed: []byte("a resealed")}, key(1, "cmd 1 resealed")}
	if ok, err := ka.ResealKeys("fp", "fp-next", stale); ok || err != nil {
		t.Errorf("a reseal of the key before its rotation: %v %v", ok, err)
	}
	check("after a stale reseal", won, wonBundle)
	if ok, err := ka.ResealKeys("fp", "fp-next", []store.SealedKey{first[0], key(2, "cmd 2 resealed")}); !ok || err != nil {
		t.Fatalf("a reseal of the rotated set: %v %v", ok, err)
	}
	if ok, err := ka.RotateKey("fp", key(3, "cmd 3"), "bundle", []byte(wonBundle), []byte("b3")); ok || err != nil {
		t.Errorf("a rotation under the key-encryption key resealed away: %v %v", ok, err)
	}
	if ok, err := ka.RotateKey("fp-next", key(3, "cmd 3"), "bundle", []byte(wonBundle), []byte("b3")); !ok || err != nil {
		t.Errorf("a rotation under the new key-encryption key: %v %v", ok, err)
	}
}

// Gateways counting on one stored value at once (SSH certificate serials)
// with UpdateMeta: every increment lands, none twice, and a function that
// returns nil writes nothing.
func testUpdateMetaAcross(t *testing.T, a, b store.Store) {
	for i, err := range race(racers, func(i int) error {
		return store.UpdateMeta(pick(a, b, i), "ssh/serial", 100, func(old []byte) ([]byte, error) {
			n := 0
			if len(old) > 0 {
				n, _ = strconv.Atoi(string(old))
			}
			return []byte(strconv.Itoa(n + 1)), nil
		})
	}) {
		if err != nil {
			t.Errorf("racer %d: %v", i, err)
		}
	}
	if got, err := b.Meta("ssh/serial"); err != nil || string(got) != strconv.Itoa(racers) {
		t.Errorf("counted to %q %v, want %d: an increment was lost", got, err, racers)
	}
	if err := store.UpdateMeta(a, "ssh/serial", 1, func([]byte) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Meta("ssh/serial"); string(got) != strconv.Itoa(racers) {
		t.Errorf("a nil update wrote %q", got)
	}
}

// Gateways swapping one value at once from the same old value (two trust
// bundle changes at the same instant): exactly one wins, and every
// gateway reads the winner's.
func testSwapMetaAcross(t *testing.T, a, b store.Store) {
	if err := a.SetMeta("trust/bundle", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	w := oneWinner(t, "swap", func(i int) (bool, error) {
		return pick(a, b, i).SwapMeta("trust/bundle", []byte("v1"), fmt.Appendf(nil, "v2 by %d", i))
	})
	for _, s := range []store.Store{a, b} {
		if got, err := s.Meta("trust/bundle"); err != nil || string(got) != fmt.Sprintf("v2 by %d", w) {
			t.Errorf("stored %q %v, want the winner's", got, err)
		}
	}
}
