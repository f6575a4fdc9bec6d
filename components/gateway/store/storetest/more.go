package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
)

func testReopenKeepsData(t *testing.T, open Open) {
	s, reopen := open(t)
	if err := s.PutToken(store.Token{ID: "jt1", Hash: store.HashSecret("x"), Role: "node", Uses: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SpendToken("jt1", "x", "node", t0); err != nil {
		t.Fatal(err)
	}
	addNode(t, s, "n1")
	if _, err := s.StartSession("n1", func(*store.Node) error { return nil }); err != nil {
		t.Fatal(err)
	}
	addCommand(t, s, "c1", "n1", t0)
	addCommand(t, s, "c2", "n1", t0.Add(time.Second))
	if _, err := s.SetResult("n1", "c1", store.Result{Status: "SUCCEEDED"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetMeta("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSpec("n1", 0, []byte(`{"a":1}`), t0); err != nil {
		t.Fatal(err)
	}
	if err := s.PutReport("n1", []byte(`{"r":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddEvent("n1", store.Event{Seq: 7, Type: "boot"}, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = reopen()
	if tok, err := s.SpendToken("jt1", "x", "node", t0); err != nil || tok.Used != 2 {
		t.Errorf("token after reopen: %+v %v, want its second use", tok, err)
	}
	if n, err := s.Node("n1"); err != nil || n.Epoch != 1 {
		t.Errorf("node after reopen: %+v %v", n, err)
	}
	if c, err := s.Command("c1"); err != nil || c.State != store.StateDone {
		t.Errorf("c1 after reopen: %+v %v", c, err)
	}
	if first, err := s.SetResult("n1", "c1", store.Result{Status: "FAILED"}); err != nil || first {
		t.Errorf("a result copy after reopen: first=%v %v, want counted only", first, err)
	}
	if un, err := s.Unfinished("n1"); err != nil || !equal(ids(un), []string{"c2"}) {
		t.Errorf("unfinished after reopen: %v %v", ids(un), err)
	}
	if v, err := s.Meta("k"); err != nil || string(v) != "v" {
		t.Errorf("meta after reopen: %q %v", v, err)
	}
	if v, err := s.Meta("absent"); err != nil || v != nil {
		t.Errorf("absent meta: %q %v", v, err)
	}
	if sp, err := s.Spec("n1"); err != nil || sp.Generation != 1 || string(sp.Spec) != `{"a":1}` {
		t.Errorf("spec after reopen: %+v %v", sp, err)
	}
	if _, err := s.PutSpec("n1", 0, []byte(`{}`), t0); !errors.Is(err, store.ErrGenerationMoved) {
		t.Errorf("put on the old base after reopen: %v", err)
	}
	if r, err := s.Report("n1"); err != nil || string(r) != `{"r":1}` {
		t.Errorf("report after reopen: %s %v", r, err)
	}
	if ok, err := s.AddEvent("n1", store.Event{Seq: 7, Type: "copy"}, 10); err != nil || ok {
		t.Errorf("event copy after reopen: stored=%v %v", ok, err)
	}
	if evs, err := s.Events("n1", 0); err != nil || len(evs) != 1 || evs[0].Type != "boot" {
		t.Errorf("events after reopen: %+v %v", evs, err)
	}
}

func testDeleteToken(t *testing.T, open Open) {
	s, _ := open(t)
	if err := s.PutToken(store.Token{ID: "jt1", Hash: store.HashSecret("x"), Role: "node", Uses: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteToken("jt1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SpendToken("jt1", "x", "node", t0); !errors.Is(err, store.ErrTokenInvalid) {
		t.Errorf("spend of a deleted token: %v", err)
	}
	if err := s.DeleteToken("absent"); err != nil {
		t.Errorf("delete of an absent token: %v", err)
	}
}

// A check that refuses leaves the token unused; the check sees the token
// as stored.
func testSpendTokenIfCheck(t *testing.T, open Open) {
	s, _ := open(t)
	if err := s.PutToken(store.Token{ID: "jt1", Hash: store.HashSecret("x"), Role: "node", Uses: 1, NodeID: "web-1", MAC: "aa"}); err != nil {
		t.Fatal(err)
	}
	no := errors.New("not this one")
	var seen store.Token
	if _, err := s.SpendTokenIf("jt1", "x", "node", t0, func(tk store.Token) error { seen = tk; return no }); !errors.Is(err, no) {
		t.Fatalf("refused check: %v", err)
	}
	if seen.NodeID != "web-1" || seen.MAC != "aa" || seen.Used != 0 {
		t.Errorf("check saw %+v", seen)
	}
	tok, err := s.SpendTokenIf("jt1", "x", "node", t0, func(store.Token) error { return nil })
	if err != nil || tok.Used != 1 || tok.NodeID != "web-1" {
		t.Errorf("spend after a refusal: %+v %v", tok, err)
	}
}

func testCancelPending(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	addCommand(t, s, "c1", "n1", t0)
	addCommand(t, s, "c2", "n1", t0.Add(time.Second))
	c, done, err := s.CancelPending("c1", "operator said so", t0.Add(time.Minute))
	if err != nil || !done || c.State != store.StateDone || c.Result == nil || c.Result.Status != "CANCELLED" ||
		c.Result.Error != "operator said so" || c.Result.FinishedMS != t0.Add(time.Minute).UnixMilli() {
		t.Fatalf("cancel of a pending command: %+v %v %v", c, done, err)
	}
	if un, _ := s.Unfinished("n1"); !equal(ids(un), []string{"c2"}) {
		t.Errorf("unfinished after cancel: %v", ids(un))
	}
	// The agent's result for a cancelled command is a copy.
	if first, err := s.SetResult("n1", "c1", store.Result{Status: "SUCCEEDED"}); err != nil || first {
		t.Errorf("result after cancel: first=%v %v", first, err)
	}
	if err := s.MarkDelivered("n1", "c2"); err != nil {
		t.Fatal(err)
	}
	if c, done, err := s.CancelPending("c2", "late", t0); err != nil || done || c.State != store.StateDelivered || c.Result != nil {
		t.Errorf("cancel of a delivered command: %+v %v %v", c, done, err)
	}
	if _, _, err := s.CancelPending("nosuch", "x", t0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cancel of an unknown command: %v", err)
	}
}

func testSubmittedSpec(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	sp, err := s.PutSubmittedSpec("n1", 0, []byte(`{"x":"<y>"}`), []byte{1, 2, 3}, t0)
	if err != nil || sp.Generation != 1 || !sp.Submitted || !bytes.Equal(sp.Signature, []byte{1, 2, 3}) {
		t.Fatalf("submitted: %+v %v", sp, err)
	}
	got, _ := s.Spec("n1")
	if !got.Submitted || !bytes.Equal(got.Signature, []byte{1, 2, 3}) || string(got.Spec) != `{"x":"<y>"}` {
		t.Errorf("stored %+v", got)
	}
	// A later gateway-made generation carries no signature.
	if sp, err := s.PutSpec("n1", 1, []byte(`{}`), t0); err != nil || sp.Submitted || sp.Signature != nil {
		t.Errorf("next generation: %+v %v", sp, err)
	}
	if sp, err := s.PutSubmittedSpec("n1", 2, []byte(`{}`), nil, t0); err != nil || !sp.Submitted || sp.Signature != nil {
		t.Errorf("submitted unsigned: %+v %v", sp, err)
	}
}

// Every field of every record comes back as stored, odd bytes included
// (a NUL and markup in a hostname the agent claimed).
func testRecordsRoundTrip(t *testing.T, open Open) {
	s, reopen := open(t)
	n := store.Node{ID: "n1", Role: "node", Site: "lab", Hostname: "a\x00<b>&\u2028c", SPIFFEID: "spiffe://x/node/n1",
		CertSerial: "ab", PrevCertSerial: "aa", PublicKey: []byte{0, 1}, PrevPublicKey: []byte{2}, MAC: "52:54:00:00:00:01",
		NotAfter: t0.Add(time.Hour), Epoch: 4, Revoked: true, JoinedAt: t0, LastSeen: t0.Add(time.Nanosecond), TokenID: "jt",
		AK: "00aa", AKPublic: []byte{9}, EK: "ek", AppliedGeneration: 3, ObservedGeneration: 2,
		InventoryHashes: map[string]string{"cpu": "h1"}, InventoryHashesAt: t0, TrustVersion: 5, TrustVersionAt: t0}
	if err := s.PutNode(n); err != nil {
		t.Fatal(err)
	}
	c := store.Command{ID: "c1", NodeID: "n1", Kind: "exec", Body: []byte{0, 0xff, '"'}, DeadlineMS: 99, Lane: "slow",
		WorkflowID: "wf", Signature: []byte{7}, CreatedAt: t0.Add(123 * time.Nanosecond)}
	if err := s.AddCommand(c); err != nil {
		t.Fatal(err)
	}
	r := store.Result{Status: "FAILED", Output: []byte{0, 1, 2}, Error: "e\x00", StartedMS: 1, FinishedMS: 2, Attestation: []byte{3}}
	if _, err := s.SetResult("n1", "c1", r); err != nil {
		t.Fatal(err)
	}
	e := store.Event{Seq: 3, Type: "t", Body: []byte{0}, AtUnixMS: 5, ReceivedAt: t0, BodyDropped: 0}
	if _, err := s.AddEvent("n1", e, 10); err != nil {
		t.Fatal(err)
	}
	meta := []byte{0, 0xff, 0xfe}
	if err := s.SetMeta("bin", meta); err != nil {
		t.Fatal(err)
	}
	check := func(s store.Store, when string) {
		got, err := s.Node("n1")
		if err != nil || !reflect.DeepEqual(got, n) {
			t.Errorf("%s: node\n got %+v %v\nwant %+v", when, got, err, n)
		}
		gc, err := s.Command("c1")
		wc := c
		wc.State, wc.Result, wc.ResultCopies = store.StateDone, &r, 1
		if err != nil || !reflect.DeepEqual(gc, wc) {
			t.Errorf("%s: command\n got %+v %v\nwant %+v", when, gc, err, wc)
		}
		if evs, err := s.Events("n1", 0); err != nil || len(evs) != 1 || !reflect.DeepEqual(evs[0], e) {
			t.Errorf("%s: events %+v %v", when, evs, err)
		}
		if v, err := s.Meta("bin"); err != nil || !bytes.Equal(v, meta) {
			t.Errorf("%s: meta %v %v", when, v, err)
		}
	}
	check(s, "stored")
	s.Close()
	check(reopen(), "reopened")
}

func testMetaDelete(t *testing.T, open Open) {
	s, _ := open(t)
	keys := []string{"cmd/c1/secret/a", "cmd/c1/secret/b", "cmd/c10/secret/a", "cmd/c1", "cmd/c2/x", "cmd/c1/\u00ff", "z"}
	for _, k := range keys {
		if err := s.SetMeta(k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := s.MetaPrefix("cmd/c1/")
	if err != nil || len(m) != 3 || string(m["cmd/c1/\u00ff"]) != "cmd/c1/\u00ff" {
		t.Errorf("MetaPrefix(cmd/c1/) = %v %v", m, err)
	}
	if m, _ := s.MetaPrefix(""); len(m) != len(keys) {
		t.Errorf("MetaPrefix(\"\") has %d keys, want %d", len(m), len(keys))
	}
	if err := s.DeleteMetaPrefix("cmd/c1/"); err != nil {
		t.Fatal(err)
	}
	m, _ = s.MetaPrefix("cmd/")
	if len(m) != 3 || m["cmd/c1"] == nil || m["cmd/c10/secret/a"] == nil || m["cmd/c2/x"] == nil {
		t.Errorf("after DeleteMetaPrefix(cmd/c1/): %v", m)
	}
	if err := s.SetMeta("z", []byte("new")); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Meta("z"); string(v) != "new" {
		t.Errorf("overwritten meta: %q", v)
	}
	// An empty value reads back as nil on every backend.
	if err := s.SetMeta("empty", []byte{}); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Meta("empty"); err != nil || v != nil {
		t.Errorf("empty meta: %#v %v, want nil", v, err)
	}
	if m, _ := s.MetaPrefix("empty"); len(m) != 1 || m["empty"] != nil {
		t.Errorf("MetaPrefix of an empty value: %#v", m)
	}
	if err := s.DeleteMeta("absent"); err != nil {
		t.Errorf("delete of absent meta: %v", err)
	}
}

// Any uint64 seq an agent sends is kept and ordered as a number.
func testEventSeqRange(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	for _, seq := range []uint64{math.MaxUint64, 1 << 63, 9, 10} {
		if ok, err := s.AddEvent("n1", store.Event{Seq: seq, Type: fmt.Sprint(seq)}, 10); err != nil || !ok {
			t.Fatalf("seq %d: %v %v", seq, ok, err)
		}
	}
	evs, err := s.Events("n1", 9)
	if err != nil || len(evs) != 3 || evs[0].Seq != 10 || evs[1].Seq != 1<<63 || evs[2].Seq != math.MaxUint64 {
		t.Errorf("events after 9: %+v %v", evs, err)
	}
	if evs, _ := s.Events("n1", math.MaxUint64); len(evs) != 0 {
		t.Errorf("events after the largest seq: %+v", evs)
	}
	// keep 0 keeps nothing, and says so.
	if ok, err := s.AddEvent("n1", store.Event{Seq: 11}, 0); err != nil || ok {
		t.Errorf("keep 0: stored=%v %v", ok, err)
	}
}

// race runs f on n goroutines started together and returns their errors.
// oneWinner runs try by racers at once and fails the test unless exactly
// one of them won and none failed; it returns the winner.
func oneWinner(t *testing.T, what string, try func(i int) (won bool, err error)) int {
	t.Helper()
	var mu sync.Mutex
	var won []int
	errs := race(racers, func(i int) error {
		ok, err := try(i)
		if ok {
			mu.Lock()
			won = append(won, i)
			mu.Unlock()
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	if len(won) != 1 {
		t.Fatalf("%s: %d of %d won (%v), want 1", what, len(won), racers, won)
	}
	return won[0]
}

func race(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = f(i)
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

const racers = 8

// Of many spenders of a token with two uses left, exactly two join.
func testConcurrentSpend(t *testing.T, open Open) {
	s, _ := open(t)
	if err := s.PutToken(store.Token{ID: "jt1", Hash: store.HashSecret("x"), Role: "node", Uses: 3, Used: 1}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	used := map[int]bool{}
	errs := race(racers, func(int) error {
		tok, err := s.SpendToken("jt1", "x", "node", t0)
		if err == nil {
			mu.Lock()
			used[tok.Used] = true
			mu.Unlock()
		}
		return err
	})
	ok, spent := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, store.ErrTokenSpent):
			spent++
		default:
			t.Errorf("spender: %v", err)
		}
	}
	if ok != 2 || spent != racers-2 || !used[2] || !used[3] {
		t.Errorf("%d joined (uses %v), %d refused spent; want 2 (uses 2 and 3) and %d", ok, used, spent, racers-2)
	}
}

// Of many copies of a command's result sent at once, exactly one is the
// first, and every copy is counted.
func testConcurrentResults(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	addCommand(t, s, "c1", "n1", t0)
	var mu sync.Mutex
	firsts := []int{}
	errs := race(racers, func(i int) error {
		first, err := s.SetResult("n1", "c1", store.Result{Status: "SUCCEEDED", Output: []byte{byte(i)}})
		if first {
			mu.Lock()
			firsts = append(firsts, i)
			mu.Unlock()
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Errorf("result: %v", err)
		}
	}
	c, err := s.Command("c1")
	if err != nil || len(firsts) != 1 || c.Result == nil || c.Result.Output[0] != byte(firsts[0]) || c.ResultCopies != racers {
		t.Errorf("firsts %v, stored %+v (copies %d) %v; want one first, stored, and %d copies", firsts, c.Result, c.ResultCopies, err, racers)
	}
}

// Of many writers on one base generation, exactly one writes the next.
func testConcurrentSpecWriters(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	for _, base := range []uint64{0, 1} { // no spec row yet, then one
		errs := race(racers, func(i int) error {
			_, err := s.PutSpec("n1", base, fmt.Appendf(nil, `{"w":%d}`, i), t0)
			return err
		})
		won, moved := -1, 0
		for i, err := range errs {
			switch {
			case err == nil && won < 0:
				won = i
			case errors.Is(err, store.ErrGenerationMoved):
				moved++
			default:
				t.Errorf("base %d writer %d: %v", base, i, err)
			}
		}
		sp, _ := s.Spec("n1")
		if won < 0 || moved != racers-1 || sp.Generation != base+1 || string(sp.Spec) != fmt.Sprintf(`{"w":%d}`, won) {
			t.Errorf("base %d: winner %d, %d moved, stored %+v", base, won, moved, sp)
		}
	}
}

// Copies of the same events sent at once are stored once each.
func testConcurrentEvents(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	var mu sync.Mutex
	stored := map[uint64]int{}
	errs := race(racers, func(i int) error {
		for seq := uint64(1); seq <= 5; seq++ {
			ok, err := s.AddEvent("n1", store.Event{Seq: seq, Type: fmt.Sprint(i)}, 100)
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
			t.Errorf("AddEvent: %v", err)
		}
	}
	evs, _ := s.Events("n1", 0)
	if len(evs) != 5 {
		t.Errorf("%d events stored, want 5", len(evs))
	}
	for seq := uint64(1); seq <= 5; seq++ {
		if stored[seq] != 1 {
			t.Errorf("seq %d reported stored %d times", seq, stored[seq])
		}
	}
}

// Concurrent read-modify-writes of one node lose no update.
func testConcurrentUpdateNode(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	errs := race(racers, func(int) error {
		for range 3 {
			if _, err := s.StartSession("n1", func(*store.Node) error { return nil }); err != nil {
				return err
			}
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Errorf("StartSession: %v", err)
		}
	}
	if n, _ := s.Node("n1"); n.Epoch != 3*racers {
		t.Errorf("epoch %d after %d increments", n.Epoch, 3*racers)
	}
}

// SwapMeta writes only over the value it was given: nil old only while
// the key is absent, an empty value is a value, and a miss changes
// nothing.
func testSwapMeta(t *testing.T, open Open) {
	s, _ := open(t)
	steps := []struct {
		old, v []byte
		want   bool
		stored string
	}{
		{nil, []byte("v1"), true, "v1"},
		{nil, []byte("again"), false, "v1"},
		{[]byte("v0"), []byte("v2"), false, "v1"},
		{[]byte{}, []byte("v2"), false, "v1"},
		{[]byte("v1"), []byte{}, true, ""},
		{nil, []byte("v3"), false, ""},
		{[]byte{}, []byte("v3"), true, "v3"},
	}
	for i, st := range steps {
		ok, err := s.SwapMeta("k", st.old, st.v)
		if err != nil || ok != st.want {
			t.Fatalf("step %d: swap %q -> %q: %v %v, want %v", i, st.old, st.v, ok, err, st.want)
		}
		if got, err := s.Meta("k"); err != nil || string(got) != st.stored {
			t.Fatalf("step %d: stored %q %v, want %q", i, got, err, st.stored)
		}
	}
}

// Writers swapping from one value at once: exactly one wins, and the
// value is the winner's.
func testConcurrentSwapMeta(t *testing.T, open Open) {
	s, _ := open(t)
	if err := s.SetMeta("k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	w := oneWinner(t, "swap", func(i int) (bool, error) {
		return s.SwapMeta("k", []byte("v1"), []byte{byte('a' + i)})
	})
	if got, _ := s.Meta("k"); string(got) != string([]byte{byte('a' + w)}) {
		t.Errorf("stored %q, want the winner's", got)
	}
}
