package bootlease

import (
	"testing"
	"time"
)

func TestLease(t *testing.T) {
	local := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &Lease{now: func() time.Time { return local }}
	if l.Active() {
		t.Fatal("a new lease is active")
	}
	// Gateway clock an hour ahead of the local one: only the interval counts.
	server := local.Add(time.Hour)
	b := BootLease{Held: true, ExpiresUnixMS: server.Add(30 * time.Second).UnixMilli()}
	l.Set(true, b.Deadline(server, local))
	if !l.Active() || l.Left() != 30*time.Second {
		t.Fatalf("active %v left %v", l.Active(), l.Left())
	}
	local = local.Add(31 * time.Second)
	if l.Active() {
		t.Fatal("an expired lease is active")
	}
	l.Set(false, time.Time{})
	if held, _ := l.State(); held || l.Active() || l.Left() != 0 {
		t.Fatal("a released lease is held")
	}
	if !(BootLease{}).Deadline(server, local).IsZero() {
		t.Error("a lease not held has a deadline")
	}
}
