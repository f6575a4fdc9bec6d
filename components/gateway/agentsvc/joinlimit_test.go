package agentsvc

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/base/backoff"
)

// TestJoinLimiter: a burst goes through, the next join is refused with
// the wait until a place frees up (plus the spread), nothing is spent by
// a refusal, and a place frees up at the rate.
func TestJoinLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newJoinLimiter(10, 3, func() time.Time { return now })
	var spread time.Duration
	l.jitter = func(d time.Duration) time.Duration { spread = d; return d / 2 }
	for i := range 3 {
		if w := l.take(); w != 0 {
			t.Fatalf("join %d of the burst refused (wait %s)", i, w)
		}
	}
	w := l.take()
	if want := 100*time.Millisecond + joinSpread/2; w != want {
		t.Fatalf("join past the burst: wait %s, want %s", w, want)
	}
	if spread != joinSpread {
		t.Errorf("jitter asked over %s, want %s", spread, joinSpread)
	}
	// A refusal spends nothing: 60 ms later the wait is 40 ms.
	now = now.Add(60 * time.Millisecond)
	if w := l.take(); w != 40*time.Millisecond+joinSpread/2 {
		t.Fatalf("after 60 ms: wait %s, want 40ms plus the spread", w)
	}
	now = now.Add(40 * time.Millisecond)
	if w := l.take(); w != 0 {
		t.Fatalf("after 100 ms a place is free; refused with %s", w)
	}
	if w := l.take(); w == 0 {
		t.Fatal("two joins admitted for one place")
	}
	// A long quiet period refills only up to the burst.
	now = now.Add(time.Hour)
	for i := range 3 {
		if w := l.take(); w != 0 {
			t.Fatalf("join %d after an hour refused", i)
		}
	}
	if w := l.take(); w == 0 {
		t.Fatal("the bucket held more than its burst")
	}
}

func TestJoinLimiterOff(t *testing.T) {
	var nilL *joinLimiter
	if nilL.take() != 0 {
		t.Fatal("a nil limiter refused")
	}
	l := newJoinLimiter(joinRate(-1), 1, time.Now)
	for range 1000 {
		if l.take() != 0 {
			t.Fatal("--join-rate -1 refused a join")
		}
	}
	if joinRate(0) != DefaultJoinRate || joinRate(5) != 5 {
		t.Fatalf("joinRate(0) = %g, joinRate(5) = %g", joinRate(0), joinRate(5))
	}
}

// TestJoinBusyPushback: the refusal is ResourceExhausted and carries a
// pushback the agent reads (components/base/backoff).
func TestJoinBusyPushback(t *testing.T) {
	err := joinBusy(200, 1234*time.Millisecond)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("code %v", connect.CodeOf(err))
	}
	if p, ok := backoff.Pushback(err); !ok || p != 1234*time.Millisecond {
		t.Fatalf("pushback %v %v, want 1.234s", p, ok)
	}
}
