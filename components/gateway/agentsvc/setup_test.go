package agentsvc

import (
	"context"
	"testing"
	"time"
)

// At most n set-ups run at once; one more waits, and is refused once it
// waited maxWait (or its context ended); a slot given back (once, however
// often release is called) admits the next.
func TestSetupGate(t *testing.T) {
	g := newSetupGate(2, 100*time.Millisecond)
	ctx := context.Background()
	r1, ok1 := g.enter(ctx)
	r2, ok2 := g.enter(ctx)
	if !ok1 || !ok2 {
		t.Fatal("the first two set-ups were not admitted")
	}
	start := time.Now()
	if _, ok := g.enter(ctx); ok {
		t.Fatal("a third set-up was admitted beside two")
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("refused after %s, before its wait", d)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, ok := g.enter(cctx); ok {
		t.Fatal("a set-up with its context ended was admitted")
	}
	r1()
	r1() // once only: a second call must not give back r2's slot
	r3, ok3 := g.enter(ctx)
	if !ok3 {
		t.Fatal("a slot given back admitted no one")
	}
	if _, ok := g.enter(ctx); ok {
		t.Fatal("release called twice gave back two slots")
	}
	got := make(chan bool)
	go func() { _, ok := g.enter(ctx); got <- ok }()
	time.Sleep(20 * time.Millisecond)
	r2()
	if !<-got {
		t.Error("a waiting set-up was not admitted when a slot came back within its wait")
	}
	r3()
}
