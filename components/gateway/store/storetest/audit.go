package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
)

// RecentCommands is newest first across nodes, and bounded.
func testRecentCommands(t *testing.T, open Open) {
	s, reopen := open(t)
	addNode(t, s, "n1")
	addNode(t, s, "n2")
	addCommand(t, s, "c1", "n1", t0)
	addCommand(t, s, "c2", "n2", t0.Add(time.Second))
	addCommand(t, s, "c3", "n1", t0.Add(2*time.Second+time.Nanosecond))
	got, err := s.RecentCommands(2)
	if err != nil || len(got) != 2 || got[0].ID != "c3" || got[1].ID != "c2" {
		t.Fatalf("RecentCommands(2) = %v %v, want c3 c2", ids(got), err)
	}
	s.Close()
	s = reopen()
	if got, err := s.RecentCommands(10); err != nil || len(got) != 3 || got[2].ID != "c1" {
		t.Fatalf("after a reopen: %v %v", ids(got), err)
	}
	if got, err := s.RecentCommands(0); err != nil || len(got) != 0 {
		t.Fatalf("RecentCommands(0) = %v %v", ids(got), err)
	}
}

// Tokens lists every join token by id; a deleted one is gone.
func testTokensList(t *testing.T, open Open) {
	s, _ := open(t)
	for _, id := range []string{"jtb", "jta", "jtc"} {
		if err := s.PutToken(store.Token{ID: id, Hash: store.HashSecret(id), Role: "node", Uses: 1, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteToken("jtc"); err != nil {
		t.Fatal(err)
	}
	got, err := s.Tokens()
	if err != nil || len(got) != 2 || got[0].ID != "jta" || got[1].ID != "jtb" || got[0].Hash != store.HashSecret("jta") {
		t.Fatalf("Tokens() = %+v %v", got, err)
	}
}

// DeleteNode takes the node's commands, spec, report and events with it,
// and leaves other nodes alone.
func testDeleteNode(t *testing.T, open Open) {
	s, _ := open(t)
	addNode(t, s, "n1")
	addNode(t, s, "n2")
	addCommand(t, s, "c1", "n1", t0)
	addCommand(t, s, "c2", "n2", t0)
	if _, err := s.PutSpec("n1", 0, []byte(`{}`), t0); err != nil {
		t.Fatal(err)
	}
	if err := s.PutReport("n1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddEvent("n1", store.Event{Seq: 1, Type: "x"}, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteNode("n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Node("n1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Node after delete: %v", err)
	}
	if _, err := s.Command("c1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("its command after delete: %v", err)
	}
	if _, err := s.Spec("n1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("its spec after delete: %v", err)
	}
	if u, err := s.Unfinished("n1"); err != nil || len(u) != 0 {
		t.Errorf("its unfinished commands after delete: %v %v", ids(u), err)
	}
	if r, _ := s.Report("n1"); len(r) != 0 {
		t.Errorf("its report after delete: %s", r)
	}
	// A node joining again under the id starts with no events.
	addNode(t, s, "n1")
	if evs, err := s.Events("n1", 0); err != nil || len(evs) != 0 {
		t.Errorf("its events after delete: %v %v", evs, err)
	}
	if _, err := s.Command("c2"); err != nil {
		t.Errorf("another node's command: %v", err)
	}
	if err := s.DeleteNode("absent"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("delete of an absent node: %v", err)
	}
}

// AddAudit numbers entries 1, 2, 3...; Audit pages through them in order
// and keeps them across a reopen.
func testAudit(t *testing.T, open Open) {
	s, reopen := open(t)
	for i := range 5 {
		e, err := s.AddAudit(store.AuditEntry{At: t0.Add(time.Duration(i) * time.Second), Actor: fmt.Sprintf("tok%d", i),
			Action: "spec.set", Target: "n1", Status: 200})
		if err != nil || e.Seq != uint64(i+1) {
			t.Fatalf("AddAudit %d: %+v %v", i, e, err)
		}
	}
	s.Close()
	s = reopen()
	all, err := s.Audit(0, 0)
	if err != nil || len(all) != 5 || all[0].Actor != "tok0" || all[4].Seq != 5 || !all[4].At.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("Audit(0, 0) = %+v %v", all, err)
	}
	page, err := s.Audit(2, 2)
	if err != nil || len(page) != 2 || page[0].Seq != 3 || page[1].Seq != 4 {
		t.Fatalf("Audit(2, 2) = %+v %v", page, err)
	}
	if e, err := s.AddAudit(store.AuditEntry{Actor: "x", Action: "node.revoke"}); err != nil || e.Seq != 6 {
		t.Fatalf("after a reopen the next seq is %d (%v), want 6", e.Seq, err)
	}
	if none, err := s.Audit(1<<63, 0); err != nil || len(none) != 0 {
		t.Fatalf("Audit past the end: %+v %v", none, err)
	}
}
