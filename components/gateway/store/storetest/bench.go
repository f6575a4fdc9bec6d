package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
)

// Bench measures the store calls a session makes most, on one backend:
// a command's life (add, ack, result), an event, a heartbeat's node
// update and a join's token spend. Each op is durable when it returns.
func Bench(b *testing.B, open Open) {
	b.Run("command", func(b *testing.B) {
		s, _ := open(b)
		addNode(b, s, "n1")
		b.ResetTimer()
		for i := range b.N {
			id := fmt.Sprintf("c%d", i)
			if err := s.AddCommand(store.Command{ID: id, NodeID: "n1", Kind: "k", CreatedAt: t0}); err != nil {
				b.Fatal(err)
			}
			if err := s.MarkDelivered("n1", id); err != nil {
				b.Fatal(err)
			}
			if _, err := s.SetResult("n1", id, store.Result{Status: "SUCCEEDED", Output: []byte(`{"ok":true}`)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("event", func(b *testing.B) {
		s, _ := open(b)
		addNode(b, s, "n1")
		body := make([]byte, 200)
		b.ResetTimer()
		for i := range b.N {
			if _, err := s.AddEvent("n1", store.Event{Seq: uint64(i + 1), Type: "t", Body: body}, 1000); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("heartbeat", func(b *testing.B) {
		s, _ := open(b)
		addNode(b, s, "n1")
		b.ResetTimer()
		for range b.N {
			if _, err := s.UpdateNode("n1", func(n *store.Node) error { n.LastSeen = time.Now(); return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("join", func(b *testing.B) {
		s, _ := open(b)
		if err := s.PutToken(store.Token{ID: "jt", Hash: store.HashSecret("x"), Role: "node", Uses: b.N}); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if _, err := s.SpendToken("jt", "x", "node", t0); err != nil {
				b.Fatal(err)
			}
		}
	})
}
