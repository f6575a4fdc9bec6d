package logbundle

import (
	"context"
	"errors"
	"github.com/better-compute/bcd/components/base/testenv"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(small, []byte("hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, []byte(strings.Repeat("x", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := FileSource("s", small).Read(context.Background()); err != nil || string(got) != "hello\n" {
		t.Errorf("FileSource = %q, %v", got, err)
	}
	if _, err := FileSource("m", filepath.Join(dir, "missing")).Read(context.Background()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	got, err := readFile(big, 10)
	if err == nil || !strings.Contains(err.Error(), "larger than 10 bytes") || len(got) != 10 {
		t.Errorf("readFile over the limit = %d bytes, %v", len(got), err)
	}
}

func TestCommandSource(t *testing.T) {
	sh := testenv.NeedTool(t, "sh", "dash")
	tests := []struct {
		name    string
		argv    []string
		timeout time.Duration
		limit   int
		out     string
		err     string // a part of the error; "" for none
	}{
		{"output", []string{sh, "-c", "echo hi; echo warn >&2"}, 0, 100, "hi\n", ""},
		{"exit status with stderr", []string{sh, "-c", "echo partial; echo 'journalctl: no access' >&2; exit 3"}, 0, 100, "partial\n", "exit status 3: journalctl: no access"},
		{"missing binary", []string{"bcd-no-such-binary-xyz", "-q"}, 0, 100, "", "executable file not found"},
		{"no argv", nil, 0, 100, "", "no command"},
		{"timeout", []string{sh, "-c", "echo started; sleep 30"}, 200 * time.Millisecond, 100, "started\n", "deadline exceeded"},
		{"capped", []string{sh, "-c", "printf 0123456789"}, 0, 4, "0123", "6 bytes were dropped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			out, err := runCommand(context.Background(), tt.argv, tt.timeout, tt.limit)
			if string(out) != tt.out {
				t.Errorf("output %q, want %q", out, tt.out)
			}
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("err = %v, want %q", err, tt.err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

func TestStandardSources(t *testing.T) {
	srcs := StandardSources("/etc/bcd/config.toml", "/var/lib/bcd", 0)
	var names []string
	for _, s := range srcs {
		names = append(names, s.Name)
		if s.Name == "node.key" {
			t.Error("the node key is a source")
		}
	}
	want := "config.toml identity.json faults.json journal.txt dmesg.txt nvidia-smi.txt"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("sources %s, want %s", got, want)
	}
}
