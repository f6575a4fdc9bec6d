package gateway

import (
	"testing"
	"time"
)

// A 30-day leaf is renewed from its 20th day on, not before.
func TestServingDue(t *testing.T) {
	nb := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	na := nb.Add(30 * 24 * time.Hour)
	for _, c := range []struct {
		at   time.Duration
		want bool
	}{{0, false}, {19 * 24 * time.Hour, false}, {20*24*time.Hour - time.Second, false}, {20 * 24 * time.Hour, true}, {31 * 24 * time.Hour, true}} {
		if got := servingDue(nb, na, nb.Add(c.at)); got != c.want {
			t.Errorf("at %s: due %v, want %v", c.at, got, c.want)
		}
	}
}
