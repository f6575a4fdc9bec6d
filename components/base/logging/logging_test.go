package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestParseLevel(t *testing.T) {
	tests := []struct {
		in      string
		want    slog.Level
		wantErr bool
	}{
		{"debug", slog.LevelDebug, false},
		{"info", slog.LevelInfo, false},
		{"", slog.LevelInfo, false},
		{"warn", slog.LevelWarn, false},
		{"error", slog.LevelError, false},
		{"INFO", 0, true},
		{"warning", 0, true},
		{"trace", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseLevel(tt.in)
		if (err != nil) != tt.wantErr || (err == nil && got != tt.want) {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name      string
		level     string
		format    string
		component string
		wantErr   bool
		wantLines int // of the debug, info and error records logged
		check     func(t *testing.T, out string)
	}{
		{
			name: "json at info", level: "info", format: "json", component: "journal", wantLines: 2,
			check: func(t *testing.T, out string) {
				first, _, _ := strings.Cut(out, "\n")
				var rec map[string]any
				if err := json.Unmarshal([]byte(first), &rec); err != nil {
					t.Fatalf("not JSON: %v: %q", err, first)
				}
				if rec["component"] != "journal" || rec["msg"] != "info msg" || rec["level"] != "INFO" || rec["n"] != float64(1) {
					t.Errorf("record %v", rec)
				}
			},
		},
		{name: "default format is json", level: "", format: "", component: "x", wantLines: 2,
			check: func(t *testing.T, out string) {
				if !strings.HasPrefix(out, "{") {
					t.Errorf("not JSON: %q", out)
				}
			}},
		{name: "debug", level: "debug", format: "json", component: "x", wantLines: 3},
		{name: "error only", level: "error", format: "json", component: "x", wantLines: 1},
		{
			name: "text", level: "warn", format: "text", component: "session", wantLines: 1,
			check: func(t *testing.T, out string) {
				if !strings.Contains(out, "component=session") || !strings.Contains(out, `msg="error msg"`) {
					t.Errorf("text record %q", out)
				}
			},
		},
		{
			name: "no component", level: "info", format: "json", component: "", wantLines: 2,
			check: func(t *testing.T, out string) {
				if strings.Contains(out, "component") {
					t.Errorf("record has a component: %q", out)
				}
			},
		},
		{name: "bad level", level: "loud", format: "json", wantErr: true},
		{name: "bad format", level: "info", format: "xml", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := New(&buf, tt.level, tt.format, tt.component)
			if tt.wantErr {
				if err == nil {
					t.Fatal("New succeeded")
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			log.Debug("debug msg", "n", 0)
			log.Info("info msg", "n", 1)
			log.Error("error msg", "n", 2)
			out := buf.String()
			if got := strings.Count(out, "\n"); got != tt.wantLines {
				t.Errorf("%d lines, want %d:\n%s", got, tt.wantLines, out)
			}
			if tt.check != nil {
				tt.check(t, out)
			}
		})
	}
}

func TestNewNilWriter(t *testing.T) {
	if _, err := New(nil, "info", "json", "x"); err == nil {
		t.Fatal("New with a nil writer succeeded")
	}
}
