package stall

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestStalled: a transfer that moves less than the minimum in a window
// ends with ErrStalled within about one window; one that keeps moving
// does not (removing the byte check ends it too, tried once).
func TestStalled(t *testing.T) {
	rule := Rule{Window: 200 * time.Millisecond, Min: 100}
	ctx, _, stop := Watch(context.Background(), rule)
	defer stop()
	start := time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(20 * rule.Window):
		t.Fatal("a transfer that moved nothing was not ended")
	}
	if took := time.Since(start); took > 3*rule.Window {
		t.Errorf("stalled transfer ended after %v, window %v", took, rule.Window)
	}
	if err := Err(ctx, errors.New("read failed")); !errors.Is(err, ErrStalled) {
		t.Errorf("Err = %v, want ErrStalled", err)
	}

	ctx, c, stop := Watch(context.Background(), rule)
	defer stop()
	end := time.After(5 * rule.Window)
	for {
		select {
		case <-ctx.Done():
			t.Fatalf("a moving transfer was ended: %v", context.Cause(ctx))
		case <-end:
			if c.Total() == 0 {
				t.Fatal("nothing counted")
			}
			return
		case <-time.After(rule.Window / 10):
			c.Add(50)
		}
	}
}

func TestDefaults(t *testing.T) {
	if got := (Rule{}).String(); got != "less than 1048576 bytes in 2m0s" {
		t.Errorf("default rule %q", got)
	}
}
