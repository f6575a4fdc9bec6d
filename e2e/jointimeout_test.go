package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestJoinTimeout: bcd join --timeout gives up on a gateway that does not
// answer once the time is up, saying so, instead of running out its
// attempts (minutes of back-off).
func TestJoinTimeout(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "2")
	cfg, _ := l.joinNode(g, "n", tok, "node")
	g.signal(syscall.SIGTERM)
	g.wait(t, 15*time.Second)
	start := time.Now()
	code, _, errOut := l.run(tok+"\n", nil, "bcd-node", "join", "--config", cfg, "--reset", "--yes", "--timeout", "2s")
	took := time.Since(start)
	if code != 1 || !strings.Contains(errOut, "not joined within --timeout 2s") || took > 20*time.Second {
		t.Fatalf("bcd join --timeout 2s with the gateway down: exit %d after %s: %s", code, took, errOut)
	}
	if code, _, errOut := l.run(tok+"\n", nil, "bcd-node", "join", "--config", cfg, "--timeout", "-1s"); code != 2 || !strings.Contains(errOut, "--timeout") {
		t.Errorf("a negative --timeout: exit %d %s", code, errOut)
	}
}
