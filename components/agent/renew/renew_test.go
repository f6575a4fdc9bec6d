package renew

import (
	"testing"
	"time"
)

func TestDue(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		life time.Duration
		want time.Duration
	}{
		{24 * time.Hour, 14*time.Hour + 24*time.Minute},
		{10 * time.Minute, 6 * time.Minute},
	} {
		if got := Due(bounds{nb, nb.Add(tc.life)}); !got.Equal(nb.Add(tc.want)) {
			t.Errorf("lifetime %s: due %s, want %s after start", tc.life, got.Sub(nb), tc.want)
		}
	}
}
