package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBootLease: bcgw grants a site's boot lease to one site agent, renews
// it with its heartbeats, and hands it to the other agent of the site once
// the holder has been gone for the lease's lifetime.
func TestBootLease(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0", "--lease-ttl", "3s", "--heartbeat", "1s")
	tok := l.token(g, "--uses", "2", "--role", "site", "--site", "fra1")
	cfgA, a := l.joinNode(g, "a", tok, "site")
	cfgB, b := l.joinNode(g, "b", tok, "site")
	pa := l.start("bcd-site", "site", "--config", cfgA)
	l.waitNode(g, a, "holding the lease", func(n nodeView) bool { return n.Connected && n.BootLease })
	l.start("bcd-site", "site", "--config", cfgB)
	l.waitNode(g, b, "connected", func(n nodeView) bool { return n.Connected })
	time.Sleep(4 * time.Second) // past one lease lifetime: a renews it
	holders := func() []string {
		var h []string
		for _, n := range l.nodes(g) {
			if n.BootLease {
				h = append(h, n.ID)
			}
		}
		return h
	}
	if h := holders(); len(h) != 1 || h[0] != a {
		t.Fatalf("lease holders %v, want only %s", h, a)
	}
	leaseOf := func(cfg string) (bool, string) {
		_, out, _ := l.run("", nil, "bcd-site", "status", "--config", cfg, "--json")
		var st struct {
			BootLease *struct {
				Held     bool
				ValidFor string `json:"valid_for"`
			} `json:"boot_lease"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil || st.BootLease == nil {
			t.Fatalf("status: %v %s", err, out)
		}
		return st.BootLease.Held, st.BootLease.ValidFor
	}
	if held, _ := leaseOf(cfgA); !held {
		t.Fatal("the holder's status says it does not hold the lease")
	}
	if held, _ := leaseOf(cfgB); held {
		t.Fatal("the other agent's status says it holds the lease")
	}

	pa.signal(syscall.SIGKILL)
	pa.wait(t, 10*time.Second)
	l.waitNode(g, b, "took over the lease", func(n nodeView) bool { return n.BootLease })
	if held, _ := leaseOf(cfgB); !held {
		t.Fatal("the new holder's status says it does not hold the lease")
	}
	// a comes back and stays silent.
	l.start("bcd-site", "site", "--config", cfgA)
	l.waitNode(g, a, "reconnected", func(n nodeView) bool { return n.Connected })
	time.Sleep(2 * time.Second)
	if h := holders(); len(h) != 1 || h[0] != b {
		t.Fatalf("lease holders after a's return %v, want only %s", h, b)
	}
	if held, _ := leaseOf(cfgA); held {
		t.Fatal("the returning agent holds the lease too")
	}
	_, out, _ := l.run("", nil, "bcd-site", "status", "--config", cfgA)
	if !strings.Contains(out, "boot lease  not held") {
		t.Fatalf("status text: %q", out)
	}
}
