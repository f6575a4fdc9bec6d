package hub

import (
	"testing"
	"time"
)

// TestHeartbeatCoalescing: after the Hello, the first heartbeat is
// written (it sets last-seen); then one is written only when it carries
// other generations or other inventory hashes, or when the stored
// last-seen is SeenRefresh old.
func TestHeartbeatCoalescing(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var b Beat
	b.HelloStored(time.Time{}, 3, 3, nil)
	h1 := map[string]string{"gpus": "sha256:aa"}
	h2 := map[string]string{"gpus": "sha256:bb"}
	steps := []struct {
		name              string
		at                time.Duration
		applied, observed uint64
		hashes            map[string]string
		want              bool
	}{
		{"first heartbeat of the session", 0, 3, 3, nil, true},
		{"nothing new", 15 * time.Second, 3, 3, nil, false},
		{"applied generation moved", 30 * time.Second, 4, 3, nil, true},
		{"observed generation moved", 45 * time.Second, 4, 4, nil, true},
		{"inventory hashes first seen", 60 * time.Second, 4, 4, h1, true},
		{"the same hashes again", 75 * time.Second, 4, 4, h1, false},
		{"no hashes in this beat", 90 * time.Second, 4, 4, nil, false},
		{"other hashes", 105 * time.Second, 4, 4, h2, true},
		{"just under the refresh", 105*time.Second + SeenRefresh - time.Second, 4, 4, nil, false},
		{"last-seen refresh due", 105*time.Second + SeenRefresh, 4, 4, nil, true},
		{"right after the refresh", 120*time.Second + SeenRefresh, 4, 4, nil, false},
	}
	for _, st := range steps {
		now := t0.Add(st.at)
		got := b.Due(now, st.applied, st.observed, st.hashes)
		if got != st.want {
			t.Fatalf("%s: due = %v, want %v", st.name, got, st.want)
		}
		if got {
			b.Wrote(now, st.applied, st.observed, st.hashes)
		}
		if !b.lastBeat.Equal(now) {
			t.Fatalf("%s: last beat %v not noted", st.name, b.lastBeat)
		}
	}
	// A write that failed is not noted: the next heartbeat tries again.
	var c Beat
	c.HelloStored(time.Time{}, 1, 1, nil)
	if !c.Due(t0, 1, 1, nil) || !c.Due(t0.Add(time.Second), 1, 1, nil) {
		t.Fatal("a heartbeat whose write was not noted is not due again")
	}
}

// TestReconnectHeartbeat: a session whose start wrote last-seen and found
// the node's inventory hashes stored writes its first heartbeat only when
// the heartbeat says something else (a reconnecting agent sends the hashes
// it sent before).
func TestReconnectHeartbeat(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	h1 := map[string]string{"gpus": "sha256:aa"}
	for _, c := range []struct {
		name              string
		applied, observed uint64
		hashes            map[string]string
		want              bool
	}{
		{"the hashes stored", 3, 3, h1, false},
		{"no hashes", 3, 3, nil, false},
		{"other hashes", 3, 3, map[string]string{"gpus": "sha256:bb"}, true},
		{"another generation", 4, 3, h1, true},
	} {
		var b Beat
		b.HelloStored(t0, 3, 3, h1)
		if got := b.Due(t0.Add(15*time.Second), c.applied, c.observed, c.hashes); got != c.want {
			t.Errorf("%s: due = %v, want %v", c.name, got, c.want)
		}
	}
}
