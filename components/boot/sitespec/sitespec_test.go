package sitespec

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/boot/bootlease"
)

func leaseBody(held bool, expires time.Time) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"boot_lease":{"held":%v,"expires_unix_ms":%d}}`, held, expires.UnixMilli()))
}

// converge runs Plan and Apply once, as the engine does.
func run(t *testing.T, s *Section, body json.RawMessage) converge.Plan {
	t.Helper()
	ctx := context.Background()
	p, err := s.Plan(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Changes) > 0 {
		if err := s.Apply(ctx, body, p); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func TestLeaseFollowsTheSection(t *testing.T) {
	lease := &bootlease.Lease{}
	s := &Section{Lease: lease}
	server := time.Now().Add(time.Hour) // the gateway's clock runs an hour ahead
	s.Arrived(1, converge.Arrival{Fresh: true, ServerNow: server, Local: time.Now()})
	run(t, s, leaseBody(true, server.Add(30*time.Second)))
	if !lease.Active() || lease.Left() > 30*time.Second || lease.Left() < 25*time.Second {
		t.Fatalf("lease active %v left %v", lease.Active(), lease.Left())
	}
	if p := run(t, s, leaseBody(true, server.Add(30*time.Second))); len(p.Changes) != 0 {
		t.Errorf("a held lease plans %v again", p.Changes)
	}
	run(t, s, leaseBody(false, time.Time{}))
	if lease.Active() {
		t.Error("a released lease is active")
	}
	// An expiry already past is not held.
	run(t, s, leaseBody(true, server.Add(-time.Second)))
	if lease.Active() {
		t.Error("an expired grant is held")
	}
}

// TestLeaseNotRevivedAfterRestart: a generation loaded from data_dir
// holds no lease, whatever its expiry says.
func TestLeaseNotRevivedAfterRestart(t *testing.T) {
	lease := &bootlease.Lease{}
	s := &Section{Lease: lease}
	now := time.Now()
	s.Arrived(7, converge.Arrival{Fresh: false, ServerNow: now, Local: now})
	run(t, s, leaseBody(true, now.Add(time.Hour)))
	if lease.Active() {
		t.Error("a lease from the stored spec is held after a restart")
	}
}

func TestCheck(t *testing.T) {
	good := strings.Repeat("a", 64)
	s := &Section{Lease: &bootlease.Lease{}}
	for body, want := range map[string]string{
		`{}`: "",
		`{"boot_lease":{"held":true,"expires_unix_ms":1}}`:                          "",
		`{"cache_images":[{"sha256":"` + good + `","url":"https://x/y"}]}`:          "",
		`{"boot_lease":{"held":"yes"}}`:                                             "cannot unmarshal",
		`{"lease":{}}`:                                                              "unknown field",
		`{"cache_images":[{"sha256":"ABC","url":"https://x/y"}]}`:                   "64 lower-case hex",
		`{"cache_images":[{"sha256":"` + good + `","url":"http://x/y"}]}`:           "not an https URL",
		`{"cache_images":[{"sha256":"` + good + `","url":"https://x/y","size":1}]}`: "unknown field",
		`[]`: "cannot unmarshal",
	} {
		err := s.Check(json.RawMessage(body))
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("Check(%s) = %v, want %q", body, err, want)
		}
	}
}

// TestCacheImagesWithoutBootServer: a site agent without [boot] listen
// fails cache_images terminally, naming the fix, and still holds its lease.
func TestCacheImagesWithoutBootServer(t *testing.T) {
	lease := &bootlease.Lease{}
	s := &Section{Lease: lease}
	now := time.Now()
	s.Arrived(1, converge.Arrival{Fresh: true, ServerNow: now, Local: now})
	body := json.RawMessage(`{"boot_lease":{"held":true,"expires_unix_ms":` + fmt.Sprint(now.Add(time.Minute).UnixMilli()) +
		`},"cache_images":[{"sha256":"` + strings.Repeat("b", 64) + `","url":"https://x/y"}]}`)
	p, err := s.Plan(context.Background(), body)
	if err != nil || len(p.Changes) == 0 {
		t.Fatalf("Plan = %v, %v", p, err)
	}
	if err := s.Apply(context.Background(), body, p); err == nil || !converge.IsTerminal(err) || !strings.Contains(err.Error(), "[boot] listen") {
		t.Errorf("Apply = %v", err)
	}
	if !lease.Active() {
		t.Error("the lease is not held beside a failing cache_images")
	}
}
