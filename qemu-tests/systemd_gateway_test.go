package qemutests

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The bcgw package in the guest, as an operator runs it: the checks the
// quick start (systemd_quickstart_test.go) makes between the page's
// blocks, where the page installs the package, starts bcgw.service on the
// guest's PostgreSQL and adds a second gateway, and after the page, where
// a gateway killed with SIGKILL is restarted by systemd.

// checkGatewayInstalled: apt install made the bcgw account and the
// key-encryption key, enabled bcgw.service and started nothing.
func checkGatewayInstalled(t *testing.T, e *systemdEnv) {
	t.Helper()
	if got := strings.TrimSpace(e.g.Must("stat -c '%a %U:%G' /etc/bcgw/kek; getent passwd bcgw | cut -d: -f6,7; systemctl is-enabled bcgw.service; systemctl is-active bcgw.service; true")); got != "600 root:root\n/var/lib/bcgw:/usr/sbin/nologin\nenabled\ninactive" {
		t.Errorf("after apt install: key, account, unit:\n%s\nwant the key root's 0600, the account, bcgw.service enabled and not started", got)
	}
}

// checkGatewayServing: a started gateway unit is Type=notify and active
// as bcgw, with neither the key nor the database in its argv; on a
// database its keys are sealed in it under the credential's key (the
// database records its fingerprint), so its data directory holds none.
func checkGatewayServing(t *testing.T, e *systemdEnv, unit, dataDir string) {
	t.Helper()
	p := e.g.Show(unit, "ActiveState", "SubState", "Type", "NRestarts", "MainPID")
	if p["ActiveState"] != "active" || p["Type"] != "notify" {
		t.Fatalf("%s after its start: %v\n%s", unit, p, e.g.Must("journalctl --no-pager -o cat -n 30 -u "+unit))
	}
	pid := p["MainPID"]
	if u := strings.TrimSpace(e.g.Must("ps -o user= -p " + pid)); u != "bcgw" {
		t.Errorf("%s runs as %s, want bcgw", unit, u)
	}
	if cmdline := e.g.Must("tr '\\0' ' ' < /proc/" + pid + "/cmdline"); strings.Contains(cmdline, "kek") || strings.Contains(cmdline, "postgres://") {
		t.Errorf("%s's argv names the key or the database: %s", unit, cmdline)
	}
	if keys := strings.TrimSpace(e.g.Must("ls " + dataDir)); strings.Contains(keys, ".key") || strings.Contains(keys, "bcgw.db") {
		t.Errorf("%s on a database holds %q, want no key file and no bbolt store", dataDir, keys)
	}
	var kek struct{ Fingerprint string }
	if err := json.Unmarshal([]byte(e.g.Must("bcgw kek fingerprint --json /etc/bcgw/kek")), &kek); err != nil || kek.Fingerprint == "" {
		t.Fatalf("bcgw kek fingerprint --json /etc/bcgw/kek: %+v %v", kek, err)
	}
	sealed := strings.TrimSpace(e.g.Must("cd / && runuser -u postgres -- psql -At -d bcgw -c 'SELECT fingerprint FROM gateway_kek'"))
	if sealed != kek.Fingerprint {
		t.Errorf("the database's keys are sealed under %q, /etc/bcgw/kek is %s", sealed, kek.Fingerprint)
	}
	if journal := e.g.Must("journalctl --no-pager -o cat -u " + unit); !strings.Contains(journal, `"msg":"bcgw serving"`) {
		t.Errorf("%s's journal has no \"bcgw serving\":\n%s", unit, tail(journal, 2000))
	}
}

// checkKilledRestarted: the gateway unit holding the node's session,
// killed with SIGKILL, is restarted by systemd (Restart=always), and the
// node reconnects through the balancer and runs a command.
func checkKilledRestarted(t *testing.T, e *systemdEnv, unit string, run func(string) string, id string) {
	t.Helper()
	pid := e.mainPID(t, unit)
	before := e.g.Show(unit, "NRestarts")["NRestarts"]
	killed := time.Now()
	e.g.Must("systemctl kill -s KILL " + unit)
	var p map[string]string
	waitFor(t, unit+" restarted after systemctl kill -s KILL", 60*time.Second, func() bool {
		p = e.g.Show(unit, "ActiveState", "NRestarts", "MainPID")
		return p["ActiveState"] == "active" && p["MainPID"] != pid && p["MainPID"] != "0"
	})
	if b, _ := json.Marshal(p); p["NRestarts"] == before {
		t.Errorf("%s NRestarts still %s after the kill: %s", unit, before, b)
	}
	t.Logf("%s killed, active again (READY=1) after %s", unit, time.Since(killed).Round(10*time.Millisecond))
	gatewayConnected(t, run, id)
	t.Logf("node %s reconnected %s after the kill", id, time.Since(killed).Round(10*time.Millisecond))
	guestPing(t, run, id)
}

// gatewayConnected waits until a gateway (bcgw through run) lists the
// node as connected, and returns the gateway holding its session.
func gatewayConnected(t *testing.T, run func(string) string, id string) string {
	t.Helper()
	var on string
	waitFor(t, "node "+id+" connected", 90*time.Second, func() bool {
		var nodes []struct {
			ID        string
			Connected bool
			Gateway   string
		}
		json.Unmarshal([]byte(run("nodes --json")), &nodes)
		for _, n := range nodes {
			if n.ID == id && n.Connected {
				on = n.Gateway
				return true
			}
		}
		return false
	})
	return on
}

func guestPing(t *testing.T, run func(string) string, id string) {
	t.Helper()
	if out := run("run " + id + " agent.ping --wait --timeout 60s"); !strings.Contains(out, `"SUCCEEDED"`) {
		t.Fatalf("bcgw run %s agent.ping:\n%s", id, out)
	}
}
