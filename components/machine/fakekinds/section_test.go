package fakekinds

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/agent/converge"
)

func TestSectionCheck(t *testing.T) {
	s := Section(t.TempDir())
	for body, want := range map[string]string{
		`{"files":{"a":"1"}}`:           "",
		`{"files":{"../x":"1"}}`:        "file name",
		`{"files":{"A":"1"}}`:           "file name",
		`{"filez":{}}`:                  "unknown field",
		`{"files":{"a":1}}`:             "cannot unmarshal",
		`{"fail":{"mode":"sometimes"}}`: "fail.mode",
		`{"apply_delay_ms":-1}`:         "apply_delay_ms",
		`{"files":{"a":"` + strings.Repeat("x", 65<<10) + `"}}`: "64 KiB",
	} {
		err := s.Check(json.RawMessage(body))
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("Check(%.40s) = %v, want %q", body, err, want)
		}
	}
}

func TestSectionConvergesAndFails(t *testing.T) {
	dir := t.TempDir()
	s := Section(dir)
	ctx := context.Background()
	body := json.RawMessage(`{"files":{"a":"1","b":"2"}}`)
	p, err := s.Plan(ctx, body)
	if err != nil || len(p.Changes) != 2 {
		t.Fatalf("Plan = %v %v", p, err)
	}
	if err := s.Apply(ctx, body, p); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Plan(ctx, body); len(p.Changes) != 0 {
		t.Errorf("after Apply: %v", p.Changes)
	}
	// Dropping b removes it.
	less := json.RawMessage(`{"files":{"a":"1"}}`)
	p, _ = s.Plan(ctx, less)
	if len(p.Changes) != 1 || p.Changes[0] != "remove b" {
		t.Fatalf("Plan = %v", p.Changes)
	}
	s.Apply(ctx, less, p)
	log, _ := os.ReadFile(filepath.Join(dir, SectionLog))
	if lines := strings.Split(strings.TrimSpace(string(log)), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "write a ") || lines[2] != "remove b" {
		t.Errorf("log %q", log)
	}
	// Retryable failures, then success; terminal always.
	s.(converge.Fresh).Arrived(7, converge.Arrival{})
	retry := json.RawMessage(`{"files":{"c":"3"},"fail":{"mode":"retryable","times":2}}`)
	for i := range 3 {
		p, _ := s.Plan(ctx, retry)
		err := s.Apply(ctx, retry, p)
		if (i < 2) != (err != nil) || converge.IsTerminal(err) {
			t.Errorf("attempt %d: %v", i, err)
		}
	}
	term := json.RawMessage(`{"fail":{"mode":"terminal"}}`)
	if err := s.Apply(ctx, term, converge.Plan{}); !converge.IsTerminal(err) {
		t.Errorf("terminal: %v", err)
	}
}
