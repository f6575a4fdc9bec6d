package clock

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestAcceptRefusesWelcomeFarBeforeMark(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := c.Accept(t0); err != nil {
		t.Fatal(err)
	}
	// Persisted: a new process sees the mark.
	c2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !c2.Mark().Equal(t0) {
		t.Fatalf("mark after reopen = %v, want %v", c2.Mark(), t0)
	}
	tests := []struct {
		name   string
		server time.Time
		ok     bool
	}{
		{"ahead", t0.Add(time.Hour), true},
		{"slightly behind", t0.Add(time.Hour - 4*time.Minute), true},
		{"six minutes behind", t0.Add(time.Hour - 6*time.Minute), false},
		{"a day behind", t0.Add(-24 * time.Hour), false},
	}
	for _, tt := range tests {
		err := c2.Accept(tt.server)
		if (err == nil) != tt.ok {
			t.Errorf("%s: Accept err = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func TestNowNeverMovesBack(t *testing.T) {
	c, _ := Open("")
	local := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.now = func() time.Time { return local }
	server := local.Add(time.Hour)
	if err := c.Accept(server); err != nil {
		t.Fatal(err)
	}
	if got := c.Now(); !got.Equal(server) {
		t.Fatalf("Now = %v, want %v", got, server)
	}
	local = local.Add(10 * time.Second)
	first := c.Now()
	// A later Welcome within MaxBehind but behind what we returned.
	if err := c.Accept(server.Add(-2 * time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := c.Now(); got.Before(first) {
		t.Fatalf("Now moved back: %v after %v", got, first)
	}
}

func TestDamagedMarkDoesNotStopTheAgent(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, File), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Open(dir)
	if err != nil || c.Damaged == nil || !c.Mark().IsZero() {
		t.Fatalf("Open on an empty mark file: %v, damaged %v", err, c.Damaged)
	}
	if err := c.Accept(time.Now()); err != nil {
		t.Fatal(err)
	}
	if c2, err := Open(dir); err != nil || c2.Damaged != nil || c2.Mark().IsZero() {
		t.Fatalf("mark not rewritten: %v %v", err, c2.Damaged)
	}
}
