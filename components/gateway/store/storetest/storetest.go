// Package storetest is the one test suite every store.Store backend
// passes: each method's contract, the exactly-once rules under
// concurrent callers, and that what was stored survives a reopen.
// A backend's test calls Run with a function opening a fresh store.
package storetest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// Open opens a fresh, empty store for one test and closes it when the
// test ends. reopen opens the same data again as a new store (the caller
// closes the first one before), as a restarted bcgw would.
type Open func(t testing.TB) (s store.Store, reopen func() store.Store)

// Run runs the whole suite against one backend.
func Run(t *testing.T, open Open) {
	for _, c := range []struct {
		name string
		f    func(*testing.T, Open)
	}{
		{"SpendToken", testSpendToken},
		{"SpendTokenUsesRunOut", testSpendTokenUsesRunOut},
		{"AddCommand", testAddCommand},
		{"CommandBatchLeafKept", testCommandBatchLeafKept},
		{"UnfinishedOrderAndRemoval", testUnfinishedOrderAndRemoval},
		{"SetResultOnce", testSetResultOnce},
		{"MarkDelivered", testMarkDelivered},
		{"StartSession", testStartSession},
		{"SessionState", testSessionState},
		{"NodesAndUpdate", testNodesAndUpdate},
		{"SpecGenerations", testSpecGenerations},
		{"EventsOncePerSeqAndKept", testEventsOncePerSeqAndKept},
		{"ReportAndMetaPrefix", testReportAndMetaPrefix},
		{"ReopenKeepsData", testReopenKeepsData},
		{"DeleteToken", testDeleteToken},
		{"SpendTokenIfCheck", testSpendTokenIfCheck},
		{"CancelPending", testCancelPending},
		{"SubmittedSpec", testSubmittedSpec},
		{"RecordsRoundTrip", testRecordsRoundTrip},
		{"MetaDelete", testMetaDelete},
		{"SwapMeta", testSwapMeta},
		{"ConcurrentSwapMeta", testConcurrentSwapMeta},
		{"EventSeqRange", testEventSeqRange},
		{"ConcurrentSpend", testConcurrentSpend},
		{"ConcurrentResults", testConcurrentResults},
		{"ConcurrentSpecWriters", testConcurrentSpecWriters},
		{"ConcurrentEvents", testConcurrentEvents},
		{"ConcurrentUpdateNode", testConcurrentUpdateNode},
		{"RecentCommands", testRecentCommands},
		{"TokensList", testTokensList},
		{"DeleteNode", testDeleteNode},
		{"Audit", testAudit},
	} {
		t.Run(c.name, func(t *testing.T) { c.f(t, open) })
	}
}

func testSpendToken(t *testing.T, open Open) {
	tests := []struct {
		name    string
		tok     store.Token
		id      string
		secret  string
		role    string
		now     time.Time
		wantErr error
	}{
		{"good", store.Token{Role: "node", Uses: 1}, "", "s3cret", "node", t0, nil},
		{"unknown id", store.Token{Role: "node", Uses: 1}, "jtother", "s3cret", "node", t0, store.ErrTokenInvalid},
		{"wrong secret", store.Token{Role: "node", Uses: 1}, "", "s3creT", "node", t0, store.ErrTokenInvalid},
		{"empty secret", store.Token{Role: "node", Uses: 1}, "", "", "node", t0, store.ErrTokenInvalid},
		{"expired", store.Token{Role: "node", Uses: 1, ExpiresAt: t0.Add(-time.Second)}, "", "s3cret", "node", t0, store.ErrTokenExpired},
		{"expires exactly now", store.Token{Role: "node", Uses: 1, ExpiresAt: t0}, "", "s3cret", "node", t0, nil},
		{"not expired", store.Token{Role: "node", Uses: 1, ExpiresAt: t0.Add(time.Minute)}, "", "s3cret", "node", t0, nil},
		{"spent", store.Token{Role: "node", Uses: 2, Used: 2}, "", "s3cret", "node", t0, store.ErrTokenSpent},
		{"wrong role", store.Token{Role: "site", Uses: 1}, "", "s3cret", "node", t0, store.ErrTokenRole},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := open(t)
			tt.tok.ID, tt.tok.Hash, tt.tok.CreatedAt = "jt1", store.HashSecret("s3cret"), t0
			if err := s.PutToken(tt.tok); err != nil {
				t.Fatal(err)
			}
			id := tt.id
			if id == "" {
				id = tt.tok.ID
			}
			got, err := s.SpendToken(id, tt.secret, tt.role, tt.now)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("SpendToken err = %v, want %v", err, tt.wantErr)
			}
			// A refusal does not use the token; a success uses it once.
			wantUsed := tt.tok.Used
			if tt.wantErr == nil {
				wantUsed++
				if got.Used != wantUsed || got.Role != tt.tok.Role {
					t.Errorf("returned token %+v, want used %d", got, wantUsed)
				}
			}
			// Read back through a spend that must see the stored count.
			again, err := s.SpendToken(tt.tok.ID, "s3cret", tt.tok.Role, t0.Add(-time.Hour))
			if wantUsed >= tt.tok.Uses {
				if !errors.Is(err, store.ErrTokenSpent) {
					t.Errorf("after: %v, want spent (used %d of %d)", err, wantUsed, tt.tok.Uses)
				}
			} else if err != nil || again.Used != wantUsed+1 {
				t.Errorf("after: %+v %v, want used %d", again, err, wantUsed+1)
			}
		})
	}
}

func testSpendTokenUsesRunOut(t *testing.T, open Open) {
	s, _ := open(t)
	if err := s.PutToken(store.Token{ID: "jt3", Hash: store.HashSecret("x"), Role: "node", Uses: 3}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		tok, err := s.SpendToken("jt3", "x", "node", t0)
		if err != nil || tok.Used != i {
			t.Fatalf("use %d: %+v %v", i, tok, err)
		}
	}
	if _, err := s.SpendToken("jt3", "x", "node", t0); !errors.Is(err, store.ErrTokenSpent) {
		t.Fatalf("fourth use: %v, want ErrTokenSpent", err)
	}
}

func addNode(t testing.TB, s store.Store, id string) {
	t.Helper()
	if err := s.PutNode(store.Node{ID: id, Role: "node", Site: "lab", JoinedAt: t0}); err != nil {
		t.Fatal(err)
	}
}

func addCommand(t *testing.T, s store.Store, id, node string, created time.Time) {
	t.Helper()
	if err := s.AddCommand(store.Command{ID: id, NodeID: node, Kind: "k", CreatedAt: created, DeadlineMS: created.Add(time.Hour).UnixMilli()}); err != nil {
		t.Fatal(err)
	}
}

func ids(cs []store.Command) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func testAddCommand(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	if err := s.AddCommand(store.Command{ID: "c1", NodeID: "nobody"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("command for an unknown node: %v, want ErrNotFound", err)
	}
	addCommand(t, s, "c1", "n1", t0)
	if err := s.AddCommand(store.Command{ID: "c1", NodeID: "n1"}); err == nil {
		t.Error("a second command with the same id was stored")
	}
	c, err := s.Command("c1")
	if err != nil || c.State != store.StatePending || c.NodeID != "n1" || c.Kind != "k" {
		t.Errorf("stored %+v %v", c, err)
	}
	if _, err := s.Command("c2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown command: %v", err)
	}
}

// A command's batch leaf is kept as it came, an empty proof step (no
// sibling at that level) included, and comes back with every read.
func testCommandBatchLeafKept(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	leaf := &store.BatchLeaf{Header: []byte(`{"v":1}`), Approvals: [][]byte{{1, 2}, {3}}, Index: 2,
		Proof: [][]byte{{}, bytes.Repeat([]byte{7}, 32)}}
	if err := s.AddCommand(store.Command{ID: "c1", NodeID: "n1", Kind: "disk.wipe", Batch: leaf, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Command("c1")
	if err != nil || c.Batch == nil || !bytes.Equal(c.Batch.Header, leaf.Header) || c.Batch.Index != 2 || len(c.Batch.Approvals) != 2 ||
		!bytes.Equal(c.Batch.Approvals[0], []byte{1, 2}) || len(c.Batch.Proof) != 2 || len(c.Batch.Proof[0]) != 0 || !bytes.Equal(c.Batch.Proof[1], leaf.Proof[1]) {
		t.Fatalf("stored %+v %v", c.Batch, err)
	}
	if u, _ := s.Unfinished("n1"); len(u) != 1 || u[0].Batch == nil || u[0].Batch.Index != 2 {
		t.Errorf("Unfinished %+v", u)
	}
}

func testUnfinishedOrderAndRemoval(t *testing.T, open Open) {
	s, _ := open(t)
	// n1x shares a prefix with n1 and must not leak into its list.
	for _, n := range []string{"n1", "n1x", "n2"} {
		addNode(t, s, n)
	}
	// Ids in the reverse of creation order: the list follows creation.
	addCommand(t, s, "c_a", "n1", t0.Add(3*time.Second))
	addCommand(t, s, "c_b", "n1", t0.Add(2*time.Second))
	addCommand(t, s, "c_c", "n1", t0.Add(1*time.Second))
	addCommand(t, s, "c_x", "n1x", t0)
	addCommand(t, s, "c_2", "n2", t0)

	steps := []struct {
		name   string
		act    func() error
		n1want []string
	}{
		{"initial", func() error { return nil }, []string{"c_c", "c_b", "c_a"}},
		{"delivered stays unfinished", func() error { return s.MarkDelivered("n1", "c_b") }, []string{"c_c", "c_b", "c_a"}},
		{"result removes", func() error { _, err := s.SetResult("n1", "c_b", store.Result{Status: "SUCCEEDED"}); return err }, []string{"c_c", "c_a"}},
		{"another node's result is refused", func() error {
			if _, err := s.SetResult("n2", "c_a", store.Result{Status: "SUCCEEDED"}); err == nil {
				return errors.New("n2 set a result for n1's command")
			}
			return nil
		}, []string{"c_c", "c_a"}},
		{"last results", func() error {
			for _, id := range []string{"c_a", "c_c"} {
				if _, err := s.SetResult("n1", id, store.Result{Status: "FAILED"}); err != nil {
					return err
				}
			}
			return nil
		}, []string{}},
	}
	for _, st := range steps {
		if err := st.act(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got, err := s.Unfinished("n1")
		if err != nil {
			t.Fatal(err)
		}
		if !equal(ids(got), st.n1want) {
			t.Errorf("%s: Unfinished(n1) = %v, want %v", st.name, ids(got), st.n1want)
		}
	}
	for node, want := range map[string][]string{"n1x": {"c_x"}, "n2": {"c_2"}, "nobody": {}} {
		got, err := s.Unfinished(node)
		if err != nil || !equal(ids(got), want) {
			t.Errorf("Unfinished(%s) = %v %v, want %v", node, ids(got), err, want)
		}
	}
}

func testSetResultOnce(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	addCommand(t, s, "c1", "n1", t0)
	first, err := s.SetResult("n1", "c1", store.Result{Status: "SUCCEEDED", Output: []byte(`1`), StartedMS: 5, FinishedMS: 6})
	if err != nil || !first {
		t.Fatalf("first result: %v %v", first, err)
	}
	again, err := s.SetResult("n1", "c1", store.Result{Status: "FAILED", Output: []byte(`2`)})
	if err != nil || again {
		t.Fatalf("repeated result: first=%v err=%v, want accepted and not first", again, err)
	}
	c, err := s.Command("c1")
	if err != nil {
		t.Fatal(err)
	}
	if c.State != store.StateDone || c.Result == nil || c.Result.Status != "SUCCEEDED" || string(c.Result.Output) != "1" || c.Result.FinishedMS != 6 {
		t.Errorf("stored %+v %+v, want the first result", c, c.Result)
	}
	if _, err := s.SetResult("n1", "nosuch", store.Result{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("result for an unknown command: %v", err)
	}
	// A late ack does not move a done command back.
	if err := s.MarkDelivered("n1", "c1"); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Command("c1"); c.State != store.StateDone {
		t.Errorf("state after a late ack: %s", c.State)
	}
}

func testMarkDelivered(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	addNode(t, s, "n2")
	addCommand(t, s, "c1", "n1", t0)
	if err := s.MarkDelivered("n2", "c1"); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Command("c1"); c.State != store.StatePending {
		t.Errorf("another node's ack changed the state to %s", c.State)
	}
	if err := s.MarkDelivered("n1", "c1"); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Command("c1"); c.State != store.StateDelivered {
		t.Errorf("state %s, want delivered", c.State)
	}
	if err := s.MarkDelivered("n1", "nosuch"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ack of an unknown command: %v", err)
	}
}

func testStartSession(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	for want := uint64(1); want <= 3; want++ {
		seen := t0.Add(time.Duration(want) * time.Minute)
		var inF uint64
		got, err := s.StartSession("n1", func(n *store.Node) error {
			inF, n.LastSeen, n.Gateway = n.Epoch, seen, "gw1"
			return nil
		})
		if err != nil || got.Epoch != want || inF != want {
			t.Fatalf("StartSession = epoch %d (%d in f) %v, want %d", got.Epoch, inF, err, want)
		}
		n, _ := s.Node("n1")
		if n.Epoch != want || !n.LastSeen.Equal(seen) || n.Gateway != "gw1" {
			t.Errorf("stored epoch %d last seen %v gateway %q, want %d %v gw1", n.Epoch, n.LastSeen, n.Gateway, want, seen)
		}
	}
	// An error from f changes nothing, the epoch included.
	if _, err := s.StartSession("n1", func(*store.Node) error { return errors.New("no") }); err == nil {
		t.Error("StartSession with a failing f succeeded")
	}
	if n, _ := s.Node("n1"); n.Epoch != 3 {
		t.Errorf("epoch %d after a failed start, want 3", n.Epoch)
	}
	if _, err := s.StartSession("nobody", func(*store.Node) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("StartSession of an unknown node: %v", err)
	}
}

// SessionState is Report, Unfinished and Spec read together.
func testSessionState(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	addNode(t, s, "n2")
	st, err := s.SessionState("n1")
	if err != nil || st.Report != nil || len(st.Unfinished) != 0 || st.Spec.Generation != 0 {
		t.Fatalf("SessionState of a new node = %+v %v, want nothing", st, err)
	}
	addCommand(t, s, "c2", "n1", t0.Add(time.Second))
	addCommand(t, s, "c1", "n1", t0)
	addCommand(t, s, "c3", "n1", t0.Add(2*time.Second))
	addCommand(t, s, "other", "n2", t0)
	if _, err := s.SetResult("n1", "c3", store.Result{Status: "SUCCEEDED"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutReport("n1", []byte(`{"r":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSpec("n1", 0, []byte(`{"a":1}`), t0); err != nil {
		t.Fatal(err)
	}
	st, err = s.SessionState("n1")
	if err != nil {
		t.Fatal(err)
	}
	if string(st.Report) != `{"r":1}` || !equal(ids(st.Unfinished), []string{"c1", "c2"}) || st.Spec.Generation != 1 || string(st.Spec.Spec) != `{"a":1}` {
		t.Errorf("SessionState = report %s, unfinished %v, spec %d %s", st.Report, ids(st.Unfinished), st.Spec.Generation, st.Spec.Spec)
	}
	if _, err := s.SessionState("nobody"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SessionState of an unknown node: %v", err)
	}
}

func testNodesAndUpdate(t *testing.T, open Open) {
	s, _ := open(t)
	for _, id := range []string{"n3", "n1", "n2"} {
		addNode(t, s, id)
	}
	nodes, err := s.Nodes()
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{nodes[0].ID, nodes[1].ID, nodes[2].ID}; !equal(got, []string{"n1", "n2", "n3"}) {
		t.Errorf("Nodes order %v", got)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateNode("n1", func(n *store.Node) error { n.Revoked = true; return boom }); !errors.Is(err, boom) {
		t.Fatalf("UpdateNode error %v", err)
	}
	if n, _ := s.Node("n1"); n.Revoked {
		t.Error("a failed update was stored")
	}
	if _, err := s.UpdateNode("nobody", func(*store.Node) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update of an unknown node: %v", err)
	}
}

func testSpecGenerations(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	addNode(t, s, "n10")
	if sp, err := s.Spec("n1"); err != nil || sp.Generation != 0 || sp.Spec != nil {
		t.Fatalf("spec of a node without one: %+v %v", sp, err)
	}
	if _, err := s.Spec("nobody"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("spec of an unknown node: %v", err)
	}
	tests := []struct {
		name    string
		node    string
		base    uint64
		spec    string
		wantGen uint64
		wantErr error
	}{
		{"first", "n1", 0, `{"host":{}}`, 1, nil},
		{"next", "n1", 1, `{"host":{"a":"<&>"}}`, 2, nil},
		{"stale base", "n1", 1, `{}`, 0, store.ErrGenerationMoved},
		{"base ahead", "n1", 5, `{}`, 0, store.ErrGenerationMoved},
		{"unknown node", "nobody", 0, `{}`, 0, store.ErrNotFound},
		{"another node counts alone", "n10", 0, `{}`, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := s.Spec(tt.node)
			got, err := s.PutSpec(tt.node, tt.base, []byte(tt.spec), t0)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("PutSpec err %v, want %v", err, tt.wantErr)
			}
			after, _ := s.Spec(tt.node)
			if tt.wantErr != nil {
				if after.Generation != before.Generation || string(after.Spec) != string(before.Spec) {
					t.Errorf("a refused put changed the spec: %+v", after)
				}
				return
			}
			// The bytes come back exactly (no re-escaping of <, &, >).
			if got.Generation != tt.wantGen || after.Generation != tt.wantGen || string(after.Spec) != tt.spec || !after.UpdatedAt.Equal(t0) {
				t.Errorf("stored %+v (returned %+v), want %s at %d", after, got, tt.spec, tt.wantGen)
			}
		})
	}
}

func testEventsOncePerSeqAndKept(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	addNode(t, s, "n10")
	add := func(node string, seq uint64, typ string) bool {
		t.Helper()
		ok, err := s.AddEvent(node, store.Event{Seq: seq, Type: typ, ReceivedAt: t0}, 3)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	steps := []struct {
		node       string
		seq        uint64
		typ        string
		wantStored bool
	}{
		{"n1", 2, "b", true},
		{"n1", 1, "a", true},
		{"n1", 2, "copy", false},
		{"n10", 1, "other node", true},
		{"n1", 10, "c", true},
		{"n1", 11, "d", true}, // the 4th: seq 1 goes
		{"n1", 1, "a again", false},
	}
	for _, st := range steps {
		if got := add(st.node, st.seq, st.typ); got != st.wantStored {
			t.Errorf("add %s seq %d: stored %v, want %v", st.node, st.seq, got, st.wantStored)
		}
	}
	evs, err := s.Events("n1", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Type)
	}
	if !equal(got, []string{"b", "c", "d"}) {
		t.Errorf("n1's events %v, want the last 3 by seq, the first copy of each", got)
	}
	if evs, _ := s.Events("n1", 2); len(evs) != 2 || evs[0].Seq != 10 {
		t.Errorf("events after 2: %+v", evs)
	}
	if evs, _ := s.Events("n10", 0); len(evs) != 1 || evs[0].Type != "other node" {
		t.Errorf("n10's events: %+v", evs)
	}
	if _, err := s.Events("nobody", 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("events of an unknown node: %v", err)
	}
	if _, err := s.AddEvent("nobody", store.Event{Seq: 1}, 3); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("event of an unknown node: %v", err)
	}
	if err := s.DeleteEvents("n1"); err != nil {
		t.Fatal(err)
	}
	if evs, _ := s.Events("n1", 0); len(evs) != 0 {
		t.Errorf("events after DeleteEvents: %+v", evs)
	}
	if evs, _ := s.Events("n10", 0); len(evs) != 1 {
		t.Errorf("DeleteEvents of n1 took n10's: %+v", evs)
	}
}

func testReportAndMetaPrefix(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	if b, err := s.Report("n1"); err != nil || b != nil {
		t.Fatalf("report before any: %q %v", b, err)
	}
	for _, r := range []string{`{"a":1}`, `{"a":2}`} {
		if err := s.PutReport("n1", []byte(r)); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := s.Report("n1"); string(b) != `{"a":2}` {
		t.Errorf("report %s, want the latest", b)
	}
	if err := s.PutReport("nobody", []byte(`{}`)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("report of an unknown node: %v", err)
	}
	for k, v := range map[string]string{"p/a": "1", "p/b": "2", "q/a": "3"} {
		if err := s.SetMeta(k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := s.MetaPrefix("p/")
	if err != nil || len(m) != 2 || string(m["p/b"]) != "2" {
		t.Errorf("MetaPrefix %v %v", m, err)
	}
	if err := s.DeleteMeta("p/a"); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.MetaPrefix("p/"); len(m) != 1 {
		t.Errorf("after DeleteMeta: %v", m)
	}
}
