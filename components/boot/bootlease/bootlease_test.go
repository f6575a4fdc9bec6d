package bootlease

import (
	"encoding/json"
	"testing"
	"time"
)

func spec(held bool, expires time.Time) []byte {
	var s SiteSpec
	s.Site.BootLease = BootLease{Held: held, ExpiresUnixMS: expires.UnixMilli()}
	b, _ := json.Marshal(s)
	return b
}

func TestLease(t *testing.T) {
	local := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &Lease{now: func() time.Time { return local }}
	if l.Active() {
		t.Fatal("a new lease is active")
	}
	// Gateway clock an hour ahead of the local one: only the interval counts.
	server := local.Add(time.Hour)
	if err := l.Apply(spec(true, server.Add(30*time.Second)), server); err != nil {
		t.Fatal(err)
	}
	if !l.Active() || l.Left() != 30*time.Second {
		t.Fatalf("active %v left %v", l.Active(), l.Left())
	}
	local = local.Add(31 * time.Second)
	if l.Active() {
		t.Fatal("an expired lease is active")
	}
	if err := l.Apply(spec(false, time.Time{}), server); err != nil || l.Active() {
		t.Fatalf("released lease: %v %v", err, l.Active())
	}
	if err := l.Apply(spec(true, server.Add(time.Minute)), server); err != nil || !l.Active() {
		t.Fatal("lease not held again")
	}
	if err := l.Apply([]byte(`{"instances":{}}`), server); err != nil || !l.Active() {
		t.Fatalf("a spec without a site section changed the lease: %v", err)
	}
	if err := l.Apply([]byte("{"), server); err == nil {
		t.Fatal("bad JSON accepted")
	}
}
