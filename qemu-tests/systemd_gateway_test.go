package qemutests

import (
	"context"
	"encoding/json"
	"io"
	"net"

	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store/pgtest"
	"github.com/jackc/pgx/v5"
)

// stepGateway: the bcgw package in the guest, as an operator runs it.
// apt install makes the bcgw account and the key-encryption key and
// starts nothing; with bcgw.env naming a PostgreSQL database (a cluster
// on the host side of the namespace, reached over the bridge),
// `systemctl start bcgw` returns once bcgw said READY=1, the key taken
// from the credential bcgw-kek (no flag names it: on a database bcgw
// refuses to start without one); a bcd-node package in the same guest
// joins it with a token; `systemctl kill -s KILL bcgw` is restarted by
// systemd and the node reconnects and runs a command. The site is purged
// in the same apt transaction (a machine is a node or a site).
func stepGateway(t *testing.T, e *systemdEnv) {
	pg := pgtest.StartT(t)
	if err := pg.CreateDatabase(context.Background(), "bcgw"); err != nil {
		t.Fatal(err)
	}
	// The cluster listens on its unix socket only: a listener inside the
	// namespace forwards the guest's connections to it.
	ln := e.ns.listen(t, guestHostIP+":5432")
	t.Cleanup(func() { ln.Close() })
	go forwardToUnix(ln, filepath.Join(pg.Dir(), ".s.PGSQL.5432"), t.Logf)

	deb := e.deb(t, "bcgw")
	if err := e.g.Copy(deb, "/root/"+filepath.Base(deb), 0o644); err != nil {
		t.Fatal(err)
	}
	// One apt transaction (each package's scripts reload systemd, which
	// takes 10-20 s under TCG): bcgw and bcd-node in, bcd-site purged;
	// then what the site and the earlier node left (their configuration,
	// identities, install.sh's drop-in) goes, for a node that joins anew
	// and runs as root.
	e.g.Must("rm -rf /etc/systemd/system/bcd.service.d")
	out := e.g.MustTimeout("cd /root && apt-get install -y --purge --no-install-recommends ./bcgw_*_amd64.deb ./bcd-node_*_amd64.deb bcd-site- 2>&1", aptDeadline)
	t.Logf("apt install ./%s ./bcd-node_*.deb bcd-site-:\n%s", filepath.Base(deb), tail(out, 800))
	e.g.Must("rm -rf /etc/bcd/* /var/lib/bcd/* /var/lib/bcd-site")
	if got := strings.TrimSpace(e.g.Must("stat -c '%a %U:%G' /etc/bcgw/kek; getent passwd bcgw | cut -d: -f6,7; systemctl is-enabled bcgw.service; systemctl is-active bcgw.service; true")); got != "600 root:root\n/var/lib/bcgw:/usr/sbin/nologin\nenabled\ninactive" {
		t.Errorf("after apt install: key, account, unit:\n%s\nwant the key root's 0600, the account, bcgw.service enabled and not started", got)
	}

	// The database URL is a file the account owns, 0600; the flags in
	// the conffile.
	url := "postgres://" + pgtest.User + "@" + guestHostIP + ":5432/bcgw?sslmode=disable"
	if err := e.g.Put("/etc/bcgw/database-url", []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.g.Must("chown bcgw:bcgw /etc/bcgw/database-url && printf 'BCGW_OPTS=\"--listen " + guestIP + ":8443 --name guest-gw --database-file /etc/bcgw/database-url\"\\n' > /etc/bcgw/bcgw.env")
	start := time.Now()
	if out, _, err := e.g.RunTimeout("systemctl start bcgw.service 2>&1", 2*time.Minute); err != nil {
		t.Fatalf("systemctl start bcgw.service: %v\n%s\n%s", err, out,
			e.g.Must("systemctl status --no-pager bcgw.service 2>&1; journalctl --no-pager -o cat -n 60 -u bcgw.service; "+
				"echo '--- the guest towards PostgreSQL:'; timeout 5 bash -c 'exec 3<>/dev/tcp/"+guestHostIP+"/5432 && echo tcp connected'; "+
				"ss -tn; nft list ruleset 2>&1 | head -40; true"))
	}
	t.Logf("systemctl start bcgw (Type=notify: returns at READY=1): %s", time.Since(start).Round(10*time.Millisecond))
	p := e.g.Show("bcgw.service", "ActiveState", "SubState", "Type", "NRestarts", "MainPID")
	if p["ActiveState"] != "active" || p["Type"] != "notify" {
		t.Fatalf("bcgw.service after systemctl start: %v\n%s", p, e.g.Must("journalctl --no-pager -o cat -n 30 -u bcgw.service"))
	}
	pid := p["MainPID"]
	if u := strings.TrimSpace(e.g.Must("ps -o user= -p " + pid)); u != "bcgw" {
		t.Errorf("bcgw runs as %s, want bcgw", u)
	}
	if cmdline := e.g.Must("tr '\\0' ' ' < /proc/" + pid + "/cmdline"); strings.Contains(cmdline, "kek") || strings.Contains(cmdline, "postgres://") {
		t.Errorf("bcgw's argv names the key or the database: %s", cmdline)
	}
	// On a database the keys are sealed in it, under the credential's
	// key (the database records its fingerprint): the data directory
	// holds none.
	if keys := strings.TrimSpace(e.g.Must("ls /var/lib/bcgw")); strings.Contains(keys, ".key") || strings.Contains(keys, "bcgw.db") {
		t.Errorf("/var/lib/bcgw on a database holds %q, want no key file and no bbolt store", keys)
	}
	var kek struct{ Fingerprint string }
	if err := json.Unmarshal([]byte(e.g.Must("bcgw kek fingerprint --json /etc/bcgw/kek")), &kek); err != nil || kek.Fingerprint == "" {
		t.Fatalf("bcgw kek fingerprint --json /etc/bcgw/kek: %+v %v", kek, err)
	}
	if sealed := sealedUnder(t, pg.URL("bcgw")); sealed != kek.Fingerprint {
		t.Errorf("the database's keys are sealed under %s, the postinst's /etc/bcgw/kek is %s", sealed, kek.Fingerprint)
	}
	journal := e.g.Must("journalctl --no-pager -o cat -u bcgw.service")
	if !strings.Contains(journal, `"msg":"bcgw serving"`) {
		t.Errorf("bcgw.service's journal has no \"bcgw serving\":\n%s", tail(journal, 2000))
	}

	// A node package in the same guest joins it.
	var doc wellKnownDoc
	if err := json.Unmarshal([]byte(e.g.Must("bcgw well-known")), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Gateway.URL != "https://"+guestIP+":8443" {
		t.Errorf("the guest's bcgw publishes %s", doc.Gateway.URL)
	}
	if err := e.g.Put("/root/gw-join.jwk", doc.Join.EncryptionJwk, 0o644); err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(e.g.Must("bcgw token create --uses 1"))
	if err := e.g.Put("/root/gw-token", []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	node := *e
	node.doc = doc
	out = e.g.Must(strings.Replace(node.installSh("--overwrite-config", "--token-file", "/root/gw-token"), "/root/join-encryption.jwk", "/root/gw-join.jwk", 1))
	t.Logf("install.sh against the guest's bcgw:\n%s", tail(out, 800))
	e.g.WaitActive("bcd.service", 90*time.Second)
	id, _ := e.identity(t)
	guestGW := func(args string) string { return e.g.Must("bcgw " + args) }
	gatewayConnected(t, guestGW, id)
	guestPing(t, guestGW, id)

	// Killed, restarted by systemd, the node back.
	killed := time.Now()
	e.g.Must("systemctl kill -s KILL bcgw.service")
	deadline := time.Now().Add(60 * time.Second)
	for {
		p = e.g.Show("bcgw.service", "ActiveState", "NRestarts", "MainPID")
		if p["ActiveState"] == "active" && p["MainPID"] != pid && p["MainPID"] != "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bcgw.service after systemctl kill -s KILL: %v\n%s", p, e.g.Must("journalctl --no-pager -o cat -n 30 -u bcgw.service"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if p["NRestarts"] != "1" {
		t.Errorf("bcgw.service NRestarts %s after one kill, want 1", p["NRestarts"])
	}
	t.Logf("bcgw killed, active again (READY=1) after %s", time.Since(killed).Round(10*time.Millisecond))
	gatewayConnected(t, guestGW, id)
	t.Logf("node %s reconnected %s after the kill", id, time.Since(killed).Round(10*time.Millisecond))
	guestPing(t, guestGW, id)
	e.checkExposure(t, "package", "bcgw.service")
}

// sealedUnder is the fingerprint of the key-encryption key a gateway's
// database records its keys sealed under.
func sealedUnder(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var fp string
	if err := conn.QueryRow(ctx, `SELECT fingerprint FROM gateway_kek`).Scan(&fp); err != nil {
		t.Fatalf("the gateway's database has no key-encryption key fingerprint: %v", err)
	}
	return fp
}

// gatewayConnected waits until a gateway (bcgw through run) lists the
// node as connected.
func gatewayConnected(t *testing.T, run func(string) string, id string) {
	t.Helper()
	waitFor(t, "node "+id+" connected", 90*time.Second, func() bool {
		var nodes []struct {
			ID        string
			Connected bool
		}
		json.Unmarshal([]byte(run("nodes --json")), &nodes)
		for _, n := range nodes {
			if n.ID == id && n.Connected {
				return true
			}
		}
		return false
	})
}

func guestPing(t *testing.T, run func(string) string, id string) {
	t.Helper()
	if out := run("run " + id + " agent.ping --wait --timeout 60s"); !strings.Contains(out, `"SUCCEEDED"`) {
		t.Fatalf("bcgw run %s agent.ping:\n%s", id, out)
	}
}

// forwardToUnix copies each connection ln accepts to and from a new
// connection to the unix socket path, until ln is closed.
func forwardToUnix(ln net.Listener, path string, logf func(string, ...any)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		logf("forwarder: a connection from %s", c.RemoteAddr())
		go func() {
			defer c.Close()
			u, err := net.Dial("unix", path)
			if err != nil {
				logf("forwarder: %v", err)
				return
			}
			defer u.Close()
			go func() { io.Copy(u, c); u.(*net.UnixConn).CloseWrite() }()
			io.Copy(c, u)
		}()
	}
}
