package hub

import (
	"testing"
	"time"

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// TestSendKeepsOrder: frames given to Send reach the session's queue in
// the order they were given, more of them than the queue holds, and
// Send never waits for the session to read them; after the session
// ended, Send returns at once.
func TestSendKeepsOrder(t *testing.T) {
	h := New()
	l := NewLive(nil, "n1", "node", "", 1)
	if _, ok := h.Register(l); !ok {
		t.Fatal("register")
	}
	const n = 500
	start := time.Now()
	for i := range n {
		h.Send("n1", &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Ack{Ack: &bcdv1.Ack{EventSeq: uint64(i)}}})
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Send waited %v for a session that reads nothing", d)
	}
	for i := range n {
		select {
		case f := <-l.Out():
			if got := f.F.GetAck().GetEventSeq(); got != uint64(i) {
				t.Fatalf("frame %d out is frame %d", i, got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("frame %d never came", i)
		}
	}
	l.Close()
	for range 100 {
		h.Send("n1", &bcdv1.GatewayFrame{})
	}
}
