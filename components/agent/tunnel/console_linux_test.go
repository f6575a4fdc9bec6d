//go:build linux

package tunnel_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/agent/tunnel"
)

// TestConsoleRefusals: root's shell only when root's config allows it;
// an account without a login shell, or unknown, never.
func TestConsoleRefusals(t *testing.T) {
	passwd := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"), 0o644)
	open := tunnel.Console(tunnel.ConsoleConfig{Passwd: passwd})
	for acct, want := range map[string]string{
		"root":    "never runs as root",
		"daemon":  "has no login shell",
		"mallory": "no local account",
	} {
		if _, err := open(context.Background(), acct); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("console as %s: %v, want %q", acct, err, want)
		}
	}
}
