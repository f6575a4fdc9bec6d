package flowwin

import (
	"context"
	"testing"
	"time"
)

func TestWindow(t *testing.T) {
	w := New()
	ctx := context.Background()
	for sent := 0; sent+32<<10 <= Size; sent += 32 << 10 {
		if err := w.Take(ctx, 32<<10); err != nil {
			t.Fatal(err)
		}
	}
	// The window is full: the next Take waits for an ack.
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := w.Take(tctx, 1); err == nil {
		t.Fatal("Take beyond the window did not wait")
	}
	done := make(chan error, 1)
	go func() { done <- w.Take(ctx, 32<<10) }()
	w.Ack(Size + 1) // impossible: more than sent, ignored
	w.Ack(64 << 10)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := w.Take(ctx, 1); err == nil {
		t.Fatal("Take after Close")
	}
	var c Consumed
	if a := c.Add(AckEvery - 1); a != 0 {
		t.Fatalf("ack before AckEvery: %d", a)
	}
	if a := c.Add(1); a != AckEvery {
		t.Fatalf("ack at AckEvery: %d", a)
	}
	c.Add(5)
	if a := c.Flush(); a != AckEvery+5 {
		t.Fatalf("flush: %d", a)
	}
	if a := c.Flush(); a != 0 {
		t.Fatalf("second flush: %d", a)
	}
}
