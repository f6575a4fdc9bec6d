package packagingtests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
)

// TestGatewayDebInstall installs the amd64 bcgw .deb into a clean Debian
// root made with debootstrap, its maintainer scripts running for real:
// the bcgw system account, the key-encryption key (root's, 0600, a key
// bcgw reads), bcgw.service enabled but not started and verified as
// installed; then an upgrade to the next version that keeps an edited
// bcgw.env (a conffile) and the key, and a purge that keeps the key and
// the account (the fleet's identity).
func TestGatewayDebInstall(t *testing.T) {
	built(t)
	c := newChroot(t)
	c.run("", "dpkg", "-i", "/tmp/v1/"+debName("bcgw", v1, "amd64"))
	checkGatewayInstalled(t, c, v1)
	if calls := c.calls(); startVerb.MatchString(calls) {
		t.Errorf("the first install started bcgw:\n%s", calls)
	}
	if !c.exists("etc/systemd/system/multi-user.target.wants/bcgw.service") {
		t.Error("bcgw.service is not enabled after the install")
	}
	c.verify("bcgw.service")
	fingerprint := c.run("", "bcgw", "kek", "fingerprint", "/etc/bcgw/kek")

	const edited = "BCGW_OPTS=\"--listen 0.0.0.0:8443\"\n"
	if err := os.WriteFile(c.path("etc/bcgw/bcgw.env"), []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	c.run("", "dpkg", "-i", "/tmp/v2/"+debName("bcgw", v2, "amd64"))
	checkGatewayInstalled(t, c, v2)
	if got := readFile(t, c.path("etc/bcgw/bcgw.env")); got != edited {
		t.Errorf("the upgrade changed the edited bcgw.env: %q", got)
	}
	if got := c.run("", "bcgw", "kek", "fingerprint", "/etc/bcgw/kek"); got != fingerprint {
		t.Errorf("the upgrade replaced the key-encryption key: %q, was %q", got, fingerprint)
	}
	calls := c.calls()
	if !strings.Contains(calls, "try-restart bcgw.service") {
		t.Errorf("the upgrade did not try-restart bcgw.service:\n%s", calls)
	}

	c.run("", "dpkg", "--purge", "bcgw")
	for _, p := range []string{"usr/bin/bcgw", "lib/systemd/system/bcgw.service", "etc/bcgw/bcgw.env", "etc/systemd/system/multi-user.target.wants/bcgw.service"} {
		if c.exists(p) {
			t.Errorf("/%s is still there after the purge", p)
		}
	}
	if calls := c.calls(); !strings.Contains(calls, "stop bcgw.service") || !strings.Contains(calls, "stop bcgw@*.service") {
		t.Errorf("the removal did not stop bcgw.service and every bcgw@ instance; systemctl calls:\n%s", calls)
	}
	if !c.exists("etc/bcgw/kek") {
		t.Error("the purge removed the key-encryption key")
	}
	if _, _, err := c.try("", "getent", "passwd", "bcgw"); err != nil {
		t.Error("the purge removed the bcgw account")
	}
}

// checkGatewayInstalled: the account is a system account with no login,
// its home the data directory; the key is root's 0600 and bcgw takes it.
func checkGatewayInstalled(t *testing.T, c *chrootEnv, version string) {
	t.Helper()
	if out := c.run("", "bcgw", "version"); !strings.HasPrefix(out, "bcgw "+version+" ") {
		t.Errorf("bcgw version: %q, want %s", out, version)
	}
	passwd := strings.Split(strings.TrimSpace(c.run("", "getent", "passwd", "bcgw")), ":")
	if len(passwd) != 7 || passwd[5] != "/var/lib/bcgw" || passwd[6] != "/usr/sbin/nologin" {
		t.Errorf("bcgw account %v: want home /var/lib/bcgw and /usr/sbin/nologin", passwd)
	}
	if uid := passwd[2]; len(uid) > 3 {
		t.Errorf("bcgw account uid %s: not a system account", uid)
	}
	if _, _, err := c.try("", "getent", "group", "bcgw"); err != nil {
		t.Error("no bcgw group")
	}
	if mode, uid, gid := c.stat("etc/bcgw/kek"); mode != 0o600 || uid != 0 || gid != 0 {
		t.Errorf("/etc/bcgw/kek: %v %d:%d, want -rw------- root:root", mode, uid, gid)
	}
	if out := c.run("", "bcgw", "kek", "fingerprint", "/etc/bcgw/kek"); strings.TrimSpace(out) == "" {
		t.Error("bcgw kek fingerprint /etc/bcgw/kek printed nothing")
	}
}

// TestGatewayRPMScriptlets installs the amd64 bcgw .rpm with rpm --root
// into a clean Debian root (debootstrap), so that rpm itself runs the
// package's %post, %preun and %postun with the root's /bin/sh, useradd
// and the logging systemctl: the account and the key are made, the unit
// enabled, an erase disables and stops it. It proves the scriptlets work
// as rpm runs them; a Debian root is not an RPM distribution (its
// useradd is Debian's shadow, the same upstream).
func TestGatewayRPMScriptlets(t *testing.T) {
	need(t, "rpm", "rpm")
	testenv.NeedRoot(t, "rpm --root into a chroot")
	built(t)
	c := newChroot(t)
	rpm := filepath.Join(fx.pkgs1, rpmName("bcgw", v1, "amd64"))
	copyFile(t, rpm, c.path("tmp/"+filepath.Base(rpm)), 0o644)
	// The scriptlets' PATH puts the root's logging systemctl first.
	db := []string{"--root", c.root, "--dbpath", "/var/lib/rpm", "--define", "_install_script_path /usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"}
	run(t, "", "rpm", append(db, "--initdb")...)
	// --nodeps: the Debian root has no RPM database of what it holds
	// (its /bin/sh and useradd are dpkg's).
	out := run(t, "", "rpm", append(db, "-i", "--nodeps", c.path("tmp/"+filepath.Base(rpm)))...)
	t.Logf("rpm -i %s:\n%s", filepath.Base(rpm), out)
	checkGatewayInstalled(t, c, v1)
	calls := c.calls()
	if !strings.Contains(calls, "enable bcgw.service") || startVerb.MatchString(calls) {
		t.Errorf("%%post: want bcgw.service enabled and nothing started, systemctl calls:\n%s", calls)
	}
	if !c.exists("etc/systemd/system/multi-user.target.wants/bcgw.service") {
		t.Error("bcgw.service is not enabled after rpm -i")
	}
	run(t, "", "rpm", append(db, "-e", "--nodeps", "bcgw")...)
	if calls := c.calls(); !strings.Contains(calls, "disable --now bcgw.service") || !strings.Contains(calls, "stop bcgw@*.service") || !strings.Contains(calls, "daemon-reload") {
		t.Errorf("%%preun/%%postun: want bcgw.service disabled and stopped, every bcgw@ instance stopped, then a daemon-reload; systemctl calls:\n%s", calls)
	}
	if c.exists("usr/bin/bcgw") || !c.exists("etc/bcgw/kek") {
		t.Error("after rpm -e: want /usr/bin/bcgw gone and /etc/bcgw/kek kept")
	}
}
