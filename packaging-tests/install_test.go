package packagingtests

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInstallScriptRefusals: install.sh refuses, before touching
// anything (and without root), --unprivileged with --plugins, a join token
// in its arguments (never echoing it), plain http and a malformed pin.
func TestInstallScriptRefusals(t *testing.T) {
	script := filepath.Join(repo(t), "build", "install.sh")
	const secret = "bcjt_jt_01secretsecretsecret"
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unprivileged with plugins", []string{"--unprivileged", "--plugins"}, "--unprivileged refuses --plugins"},
		{"plugins first", []string{"--plugins", "--unprivileged"}, "--unprivileged refuses --plugins"},
		{"a token as an argument", []string{"--gateway", "https://gw.example.com", secret}, "never in arguments"},
		{"a token as a flag", []string{"--" + secret}, "unknown flag"},
		{"a token as a flag's value", []string{"--token=" + secret}, "unknown flag"},
		{"http", []string{"--from", "http://example.com/pkgs", "--version", "1.0.0"}, "plain http:// is refused"},
		{"a malformed pin", []string{"--serving-ca-pin", "sha256/short"}, "a pin is sha256/"},
		{"site unprivileged", []string{"--role", "site", "--unprivileged"}, "--unprivileged is for nodes"},
		{"both token sources", []string{"--token-stdin", "--token-file", "/etc/hostname"}, "not both"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, err := runErr("", script, c.args...)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2\n%s%s", err, out, errOut)
			}
			if !strings.Contains(errOut, c.want) {
				t.Errorf("stderr %q lacks %q", errOut, c.want)
			}
			if strings.Contains(out+errOut, secret) {
				t.Errorf("the token was echoed: %q", out+errOut)
			}
		})
	}
}

// chrootEnv is a clean Debian root with bcd's packages and install.sh
// copied in, and a stand-in systemctl that logs every call. Offline
// verbs (enable, preset, mask...) run the real systemctl; the verbs that
// need a running manager only log, and /run/systemd/system exists, so the
// scripts behave as on a booted host and the test sees what they would
// have started.
type chrootEnv struct {
	t    *testing.T
	root string
}

const systemctlShim = `#!/bin/sh
# The package tests' systemctl: logs each call; runs the real one for the
# verbs that work without a running manager.
echo "$*" >>/var/log/systemctl-calls
case " $* " in
*" start "* | *" stop "* | *" restart "* | *" try-restart "* | *" reload "* | *" reload-or-restart "* | *" daemon-reload "* | *" is-active "*)
	exit 0 ;;
esac
# Offline, as the manager would: the chroot has no D-Bus.
case " $* " in
*" --root="*) exec /usr/bin/systemctl "$@" ;;
esac
exec /usr/bin/systemctl --root=/ "$@"
`

func newChroot(t *testing.T) *chrootEnv {
	c := &chrootEnv{t: t, root: debianRoot(t)}
	for _, d := range []string{"tmp/v1", "tmp/v2", "run/systemd/system", "usr/local/sbin"} {
		if err := os.MkdirAll(filepath.Join(c.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for dir, pattern := range map[string]string{"tmp/v1": filepath.Join(fx.pkgs1, "*.deb"), "tmp/v2": filepath.Join(fx.pkgs2, "*.deb")} {
		debs, _ := filepath.Glob(pattern)
		for _, d := range debs {
			copyFile(t, d, filepath.Join(c.root, dir, filepath.Base(d)), 0o644)
		}
	}
	copyFile(t, filepath.Join(repo(t), "build", "install.sh"), filepath.Join(c.root, "tmp", "install.sh"), 0o755)
	if err := os.WriteFile(filepath.Join(c.root, "usr/local/sbin/systemctl"), []byte(systemctlShim), 0o755); err != nil {
		t.Fatal(err)
	}
	return c
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, mode); err != nil {
		t.Fatal(err)
	}
}

// run runs a command in the root and returns its stdout.
func (c *chrootEnv) run(stdin string, args ...string) string {
	c.t.Helper()
	return run(c.t, stdin, "chroot", append([]string{c.root}, args...)...)
}

// try runs a command in the root and returns both outputs and its error.
func (c *chrootEnv) try(stdin string, args ...string) (string, string, error) {
	return runErr(stdin, "chroot", append([]string{c.root}, args...)...)
}

func (c *chrootEnv) path(p string) string { return filepath.Join(c.root, p) }

// calls returns the systemctl calls since the last time, and forgets them.
func (c *chrootEnv) calls() string {
	p := c.path("var/log/systemctl-calls")
	data, _ := os.ReadFile(p)
	os.Remove(p)
	c.t.Logf("systemctl calls:\n%s", data)
	return string(data)
}

var startVerb = regexp.MustCompile(`(?m)(^|\s)(start|restart|reload-or-restart|enable --now)(\s|$)`)

func (c *chrootEnv) stat(p string) (mode os.FileMode, uid, gid uint32) {
	c.t.Helper()
	st, err := os.Lstat(c.path(p))
	if err != nil {
		c.t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	return st.Mode(), sys.Uid, sys.Gid
}

func (c *chrootEnv) exists(p string) bool {
	_, err := os.Lstat(c.path(p))
	return err == nil
}

// verify runs systemd-analyze verify on installed units inside the root:
// it must pass with nothing to say.
func (c *chrootEnv) verify(units ...string) {
	c.t.Helper()
	out, errOut, err := c.try("", append([]string{"systemd-analyze", "verify"}, units...)...)
	if err != nil || strings.TrimSpace(out+errOut) != "" {
		c.t.Errorf("systemd-analyze verify %v: %v\n%s%s", units, err, out, errOut)
	}
}

func (c *chrootEnv) version(want string) {
	c.t.Helper()
	if out := c.run("", "bcd", "version"); !strings.HasPrefix(out, want) {
		c.t.Errorf("bcd version: %q, want %q...", out, want)
	}
}

// TestDebianInstall installs the amd64 .deb into a clean Debian root made
// with debootstrap and follows a node's life: the package alone (nothing
// started, no account), install.sh --unprivileged joining a real bcgw
// (the bcd account, the helper, config.toml root:bcd 0640), an upgrade to
// the next version that keeps an edited config.toml, an install.sh rerun
// that takes bcd out of the tss group; then the node/site conflict, the
// machine repurposed as a site by install.sh (as root, its own data
// directory), the ramdisk images and a purge.
func TestDebianInstall(t *testing.T) {
	built(t)
	start := time.Now()
	c := newChroot(t)
	lap := func(what string) {
		t.Logf("%-44s %s", what, time.Since(start).Round(100*time.Millisecond))
	}
	lap("clean Debian root ready")
	deb1 := "/tmp/v1/" + debName("bcd-node", v1, "amd64")
	deb2 := "/tmp/v2/" + debName("bcd-node", v2, "amd64")

	// The package alone: the binary runs, /var/lib/bcd 0700, the agent's
	// units enabled but nothing started (there is no config.toml), no
	// account (only the helper setup makes it).
	c.run("", "dpkg", "-i", deb1)
	c.version("bcd " + v1 + " (node) linux/amd64")
	if mode, uid, _ := c.stat("var/lib/bcd"); mode != os.ModeDir|0o700 || uid != 0 {
		t.Errorf("/var/lib/bcd: %v uid %d, want drwx------ root", mode, uid)
	}
	if _, _, err := c.try("", "getent", "passwd", "bcd"); err == nil {
		t.Error("installing the package alone created the bcd account")
	}
	for unit, enabled := range map[string]bool{"bcd.service": true, "bcd-join.service": true, "bcd-helper.service": false} {
		if got := c.exists("etc/systemd/system/multi-user.target.wants/" + unit); got != enabled {
			t.Errorf("%s enabled: %v, want %v", unit, got, enabled)
		}
	}
	if calls := c.calls(); startVerb.MatchString(calls) {
		t.Errorf("the first install started a unit without a configuration:\n%s", calls)
	}
	if c.exists("etc/bcd/config.toml") {
		t.Error("the package shipped /etc/bcd/config.toml")
	}
	c.verify("bcd.service", "bcd-join.service", "bcd-helper.service")
	lap("dpkg -i " + filepath.Base(deb1))

	// install.sh --unprivileged joins a real bcgw (on this machine's
	// loopback, which the chroot shares) with the token on stdin.
	gw := startGateway(t)
	c.run("", "groupadd", "--system", "tss")
	c.run("", "groupadd", "--system", "libvirt")
	token := gw.token(t)
	args := []string{"/tmp/install.sh", "--unprivileged", "--gateway", gw.doc.Gateway.URL, "--server-name", gw.doc.Gateway.ServerName,
		"--serving-ca-pin", gw.doc.Pins.ServingCa, "--join-signing-pin", gw.doc.Pins.JoinSigning, "--join-encryption-pin", gw.doc.Pins.JoinEncryption,
		"--site", "lab1", "--server", gw.url(), "--token-stdin"}
	out, errOut, err := c.try(token+"\n", args...)
	if err != nil {
		t.Fatalf("install.sh --unprivileged: %v\n%s%s", err, out, errOut)
	}
	t.Logf("install.sh --unprivileged:\n%s%s", out, errOut)
	if !strings.Contains(out, "joined as node_") {
		t.Errorf("install.sh did not join: %q", out)
	}
	if strings.Contains(out+errOut, token) {
		t.Error("install.sh printed the join token")
	}
	if c.exists("etc/bcd/join-token") {
		t.Error("the join token file is still there after the join")
	}
	passwd := strings.Split(strings.TrimSpace(c.run("", "getent", "passwd", "bcd")), ":")
	if len(passwd) != 7 || passwd[5] != "/nonexistent" || passwd[6] != "/usr/sbin/nologin" {
		t.Errorf("bcd account %v: want no home (/nonexistent) and /usr/sbin/nologin", passwd)
	}
	if groups := strings.TrimSpace(c.run("", "id", "-nG", "bcd")); groups != "bcd" {
		t.Errorf("bcd is in %q, want only its own group (never libvirt or tss)", groups)
	}
	uid := strings.TrimSpace(c.run("", "id", "-u", "bcd"))
	gid := strings.TrimSpace(c.run("", "id", "-g", "bcd"))
	if mode, u, g := c.stat("etc/bcd/config.toml"); mode != 0o640 || u != 0 || fmt.Sprint(g) != gid {
		t.Errorf("config.toml: %v %d:%d, want -rw-r----- root:bcd", mode, u, g)
	}
	for _, p := range []string{"var/lib/bcd", "var/lib/bcd/identity.json", "var/lib/bcd/node.key"} {
		if _, u, g := c.stat(p); fmt.Sprint(u) != uid || fmt.Sprint(g) != gid {
			t.Errorf("%s is %d:%d, want bcd's", p, u, g)
		}
	}
	dropin := "etc/systemd/system/bcd.service.d/10-unprivileged.conf"
	if got, err := os.ReadFile(c.path(dropin)); err != nil || string(got) != readRepo(t, "build/systemd/bcd.service.d/10-unprivileged.conf") {
		t.Errorf("%s: %v", dropin, err)
	}
	if !c.exists("etc/systemd/system/multi-user.target.wants/bcd-helper.service") {
		t.Error("install.sh --unprivileged did not enable bcd-helper.service")
	}
	if calls := c.calls(); !strings.Contains(calls, "restart bcd-helper.service") || !strings.Contains(calls, "restart bcd.service") {
		t.Errorf("install.sh did not start the helper and the node:\n%s", calls)
	}
	c.verify("bcd.service", "bcd-join.service", "bcd-helper.service")
	// The bcd account reads its configuration and its identity.
	doctor, _, _ := c.try("", "chroot", "--userspec="+uid+":"+gid, "/", "/usr/bin/bcd", "doctor", "--config", "/etc/bcd/config.toml")
	for _, want := range []string{"ok    config ", "ok    identity ", "ok    gateway "} {
		if !strings.Contains(doctor, want) {
			t.Errorf("bcd doctor as bcd lacks %q:\n%s", strings.TrimSpace(want), doctor)
		}
	}
	lap("install.sh --unprivileged, joined")

	// An operator's edit survives the upgrade to the next version, byte
	// for byte, with its owner and mode; so do the account and the drop-in.
	f, err := os.OpenFile(c.path("etc/bcd/config.toml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("\n# edited by the operator\n[log]\nlevel = \"debug\"\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	edited := readFile(t, c.path("etc/bcd/config.toml"))
	c.run("", "dpkg", "-i", deb2)
	c.version("bcd " + v2 + " (node) linux/amd64")
	if v := c.run("", "dpkg-query", "-W", "-f", "${Version}", "bcd-node"); v != v2 {
		t.Errorf("bcd-node %s installed, want %s", v, v2)
	}
	if got := readFile(t, c.path("etc/bcd/config.toml")); got != edited {
		t.Errorf("the upgrade changed config.toml:\n%s\nwant\n%s", got, edited)
	}
	if mode, u, g := c.stat("etc/bcd/config.toml"); mode != 0o640 || u != 0 || fmt.Sprint(g) != gid {
		t.Errorf("after the upgrade config.toml is %v %d:%d", mode, u, g)
	}
	if !c.exists(dropin) || !c.exists("var/lib/bcd/identity.json") {
		t.Error("the upgrade lost the drop-in or the identity")
	}
	calls := c.calls()
	if !strings.Contains(calls, "try-restart bcd-helper.service bcd.service") {
		t.Errorf("the upgrade did not restart the running units:\n%s", calls)
	}
	if startVerb.MatchString(calls) {
		t.Errorf("the upgrade started units rather than restarting running ones:\n%s", calls)
	}
	lap("dpkg -i " + filepath.Base(deb2) + " (upgrade)")

	// A rerun of install.sh (here from a directory with --from) keeps the
	// configuration and takes bcd out of tss, where an older install
	// might have put it.
	c.run("", "usermod", "-aG", "tss", "bcd")
	out, errOut, err = c.try("", "/tmp/install.sh", "--unprivileged", "--from", "/tmp/v2", "--version", v2)
	if err != nil {
		t.Fatalf("install.sh rerun: %v\n%s%s", err, out, errOut)
	}
	if !strings.Contains(errOut, "kept /etc/bcd/config.toml") || readFile(t, c.path("etc/bcd/config.toml")) != edited {
		t.Errorf("the rerun did not keep config.toml:\n%s", errOut)
	}
	if groups := strings.TrimSpace(c.run("", "id", "-nG", "bcd")); groups != "bcd" {
		t.Errorf("after the rerun bcd is in %q", groups)
	}
	c.calls()
	lap("install.sh rerun")

	// A machine is a node or a site.
	site := "/tmp/v1/" + debName("bcd-site", v1, "amd64")
	if _, errOut, err := c.try("", "dpkg", "-i", site); err == nil || !strings.Contains(errOut, "conflict") {
		t.Errorf("bcd-site installed beside bcd-node: %v\n%s", err, errOut)
	}
	if _, errOut, err := c.try("", "/tmp/install.sh", "--role", "site", "--package", site); err == nil || !strings.Contains(errOut, "bcd-node is installed") {
		t.Errorf("install.sh --role site beside bcd-node: %v\n%s", err, errOut)
	}
	c.run("", "dpkg", "-r", "bcd-node")
	if calls := c.calls(); !strings.Contains(calls, "stop bcd.service bcd-join.service bcd-helper.service") {
		t.Errorf("removing bcd-node did not stop its units:\n%s", calls)
	}
	if readFile(t, c.path("etc/bcd/config.toml")) != edited || !c.exists("var/lib/bcd/identity.json") {
		t.Error("removing bcd-node removed the configuration or the identity")
	}
	lap("node removed")

	// The machine becomes a site: the operator clears the node's
	// configuration and identity, and install.sh installs bcd-site as root
	// with a site token from a file and another data directory.
	for _, p := range []string{"etc/bcd/config.toml", "etc/bcd/join-encryption.jwk", "var/lib/bcd"} {
		if err := os.RemoveAll(c.path(p)); err != nil {
			t.Fatal(err)
		}
	}
	siteToken := strings.TrimSpace(run(t, "", gw.bin, "token", "create", "--role", "site", "--site", "fsn1", "--data-dir", gw.dataDir))
	if err := os.WriteFile(c.path("root/site-token"), []byte(siteToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = c.try("", "/tmp/install.sh", "--role", "site", "--package", site, "--gateway", gw.doc.Gateway.URL, "--server-name", gw.doc.Gateway.ServerName,
		"--serving-ca-pin", gw.doc.Pins.ServingCa, "--join-signing-pin", gw.doc.Pins.JoinSigning, "--join-encryption-pin", gw.doc.Pins.JoinEncryption,
		"--site", "fsn1", "--server", gw.url(), "--data-dir", "/srv/bcd", "--token-file", "/root/site-token")
	if err != nil {
		t.Fatalf("install.sh --role site: %v\n%s%s", err, out, errOut)
	}
	t.Logf("install.sh --role site:\n%s%s", out, errOut)
	if !regexp.MustCompile(`joined as node_\S+ \(site fsn1, role site\)`).MatchString(out) {
		t.Errorf("install.sh --role site did not join as a site: %q", out)
	}
	if strings.Contains(out+errOut, siteToken) {
		t.Error("install.sh printed the site token")
	}
	c.version("bcd " + v1 + " (site) linux/amd64")
	if mode, u, g := c.stat("etc/bcd/config.toml"); mode != 0o600 || u != 0 || g != 0 {
		t.Errorf("config.toml: %v %d:%d, want -rw------- root:root", mode, u, g)
	}
	if mode, u, _ := c.stat("srv/bcd"); mode != os.ModeDir|0o700 || u != 0 {
		t.Errorf("/srv/bcd: %v uid %d", mode, u)
	}
	if !c.exists("srv/bcd/identity.json") || c.exists("etc/bcd/join-token") {
		t.Error("the site did not join into /srv/bcd, or its token is still there")
	}
	if got := readFile(t, c.path("etc/systemd/system/bcd-site.service.d/20-data-dir.conf")); !strings.Contains(got, "ReadWritePaths=/srv/bcd\n") {
		t.Errorf("the data directory drop-in: %q", got)
	}
	if !c.exists("etc/systemd/system/multi-user.target.wants/bcd-site.service") {
		t.Error("bcd-site.service is not enabled")
	}
	if calls := c.calls(); !strings.Contains(calls, "restart bcd-site.service") {
		t.Errorf("install.sh did not start bcd-site.service:\n%s", calls)
	}
	c.verify("bcd-site.service")
	edited = readFile(t, c.path("etc/bcd/config.toml"))
	lap("install.sh --role site, joined")

	// The ramdisk images are architecture-independent: both install here.
	c.run("", "dpkg", "-i", "/tmp/v1/"+debName("bcd-ramdisk-image-amd64", v1, "all"), "/tmp/v1/"+debName("bcd-ramdisk-image-arm64", v1, "all"))
	for _, arch := range []string{"amd64", "arm64"} {
		for _, f := range []string{"vmlinuz", "initramfs.cpio.zst", "ramdisk.ipxe"} {
			p := "usr/share/bcd/ramdisk/" + arch + "/" + f
			sum := strings.Fields(readFile(t, c.path(p+".sha256")))[0]
			if got := sha256File(t, c.path(p)); got != sum {
				t.Errorf("%s: SHA-256 %s, its .sha256 says %s", p, got, sum)
			}
		}
	}
	// A purge leaves the operator's configuration.
	c.run("", "dpkg", "-P", "bcd-site")
	if c.exists("etc/systemd/system/multi-user.target.wants/bcd-site.service") {
		t.Error("purging bcd-site left bcd-site.service enabled")
	}
	if readFile(t, c.path("etc/bcd/config.toml")) != edited {
		t.Error("purging bcd-site removed config.toml")
	}
	lap("ramdisk images, bcd-site purged")
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func readRepo(t *testing.T, p string) string {
	t.Helper()
	return readFile(t, filepath.Join(repo(t), p))
}

// gateway is a bcgw serving on this machine's loopback.
type gateway struct {
	bin, dataDir string
	doc          struct {
		Gateway struct{ URL, ServerName string }
		Pins    struct{ ServingCa, JoinSigning, JoinEncryption string }
	}
}

func (g *gateway) url() string { return g.doc.Gateway.URL }

func (g *gateway) token(t *testing.T) string {
	t.Helper()
	return strings.TrimSpace(run(t, "", g.bin, "token", "create", "--uses", "1", "--data-dir", g.dataDir))
}

// startGateway builds bcgw and runs it on 127.0.0.1 until the test ends.
func startGateway(t *testing.T) *gateway {
	t.Helper()
	g := &gateway{bin: filepath.Join(fx.dir, "bcgw"), dataDir: filepath.Join(t.TempDir(), "gw")}
	build := exec.Command("go", "build", "-trimpath", "-o", g.bin, "./cmd/bcgw")
	build.Dir = repo(t)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/bcgw: %v\n%s", err, out)
	}
	cmd := exec.Command(g.bin, "serve", "--data-dir", g.dataDir, "--listen", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	serving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			if !once && strings.Contains(sc.Text(), `"bcgw serving"`) {
				once = true
				close(serving)
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	select {
	case <-serving:
	case <-time.After(30 * time.Second):
		t.Fatal("bcgw did not start serving within 30s")
	}
	if err := json.Unmarshal([]byte(run(t, "", g.bin, "well-known", "--data-dir", g.dataDir)), &g.doc); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestRPMInstall installs the amd64 .rpm into an empty root with rpm
// --root (no shell there, so without its scriptlets, which
// TestMaintainerScripts checks), runs the installed bcd, and upgrades to
// the next version keeping a config.toml written beside it.
func TestRPMInstall(t *testing.T) {
	need(t, "rpm", "rpm")
	testenv.NeedRoot(t, "rpm --root installs files owned by root")
	built(t)
	root := t.TempDir()
	rpm := func(args ...string) {
		t.Helper()
		run(t, "", "rpm", append([]string{"--root", root, "--dbpath", "/var/lib/rpm"}, args...)...)
	}
	rpm("--initdb")
	rpm("-i", "--nodeps", "--noscripts", filepath.Join(fx.pkgs1, rpmName("bcd-node", v1, "amd64")))
	if out := run(t, "", filepath.Join(root, "usr/bin/bcd"), "version"); !strings.HasPrefix(out, "bcd "+v1+" (node)") {
		t.Errorf("installed bcd version: %q", out)
	}
	conf := filepath.Join(root, "etc/bcd/config.toml")
	const edited = "# edited\ngateway = \"https://gw.example.com\"\n"
	if err := os.WriteFile(conf, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	rpm("-U", "--nodeps", "--noscripts", filepath.Join(fx.pkgs2, rpmName("bcd-node", v2, "amd64")))
	if out := run(t, "", filepath.Join(root, "usr/bin/bcd"), "version"); !strings.HasPrefix(out, "bcd "+v2+" (node)") {
		t.Errorf("upgraded bcd version: %q", out)
	}
	if got := readFile(t, conf); got != edited {
		t.Errorf("the upgrade changed config.toml: %q", got)
	}
	if st, err := os.Stat(conf); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("config.toml after the upgrade: %v %v", st, err)
	}
	if out := run(t, "", "rpm", "--root", root, "--dbpath", "/var/lib/rpm", "-q", "bcd-node"); strings.TrimSpace(out) != "bcd-node-"+v2+"-1.x86_64" {
		t.Errorf("rpm -q bcd-node: %q", out)
	}
}
