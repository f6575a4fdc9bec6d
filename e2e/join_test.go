package e2e

import (
	"fmt"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/anchor"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// TestJoinRefusals: a token as an argument exits 2 and is never echoed;
// wrong pins are refused naming the pin; a token used more than its uses
// is refused; a token file must be private and is removed on success; a
// site agent refuses a node identity. No token reaches any output.
func TestJoinRefusals(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1")
	pins := strings.Fields(l.bcgw(g, "well-known", "--pins"))
	pin := func(i int) string { return pins[i][strings.Index(pins[i], "=")+1:] }
	serving, signing, enc := pin(0), pin(1), pin(2)

	t.Run("token as argument", func(t *testing.T) {
		for _, args := range [][]string{
			{"join", tok},
			{"join", "--config", "/nonexistent", tok},
			{"join", "--token=" + tok},
			{"join", "-" + tok},
		} {
			code, out, errOut := l.run("", nil, "bcd-node", args...)
			if code != 2 {
				t.Errorf("%d args: exit %d, want 2", len(args), code)
			}
			if strings.Contains(out+errOut, tok) || strings.Contains(out+errOut, "bcjt_") {
				t.Errorf("the token was echoed: %q", out+errOut)
			}
		}
		_, _, errOut := l.run("", nil, "bcd-node", "join", tok)
		if !strings.Contains(errOut, "bcd join: takes no positional arguments") || !strings.Contains(errOut, "never from arguments") {
			t.Errorf("stderr %q", errOut)
		}
	})

	joinArgs := func(dir string, s, si, e string) []string {
		return []string{"join", "--config", filepath.Join(dir, "config.toml"), "--data-dir", filepath.Join(dir, "data"),
			"--server", "https://" + g.addr, "--serving-ca-pin", s, "--join-signing-pin", si, "--join-encryption-pin", e}
	}
	t.Run("wrong pins", func(t *testing.T) {
		for _, tc := range []struct {
			name, s, si, e, want string
		}{
			{"serving", signing, signing, enc, "--serving-ca-pin"},
			{"signing", serving, enc, enc, "--join-signing-pin"},
			{"encryption", serving, signing, signing, "--join-encryption-pin"},
		} {
			dir := filepath.Join(l.root, "wrong-"+tc.name)
			code, _, errOut := l.run(tok+"\n", nil, "bcd-node", joinArgs(dir, tc.s, tc.si, tc.e)...)
			if code != 1 || !strings.Contains(errOut, tc.want) {
				t.Errorf("%s: exit %d, stderr %q; want exit 1 naming %s", tc.name, code, errOut, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "config.toml")); err == nil {
				t.Errorf("%s: a refused join wrote config.toml", tc.name)
			}
		}
	})

	t.Run("no token", func(t *testing.T) {
		code, _, errOut := l.run("", nil, "bcd-node", joinArgs(filepath.Join(l.root, "none"), serving, signing, enc)...)
		if code != 2 || !strings.Contains(errOut, "no join token") {
			t.Errorf("exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("token file", func(t *testing.T) {
		f := filepath.Join(l.root, "token")
		if err := os.WriteFile(f, []byte("\xef\xbb\xbf"+tok+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(l.root, "tf")
		code, _, errOut := l.run("", nil, "bcd-node", append(joinArgs(dir, serving, signing, enc), "--token-file", f)...)
		if code != 1 || !strings.Contains(errOut, "chmod 0600") {
			t.Fatalf("a 0644 token file: exit %d, stderr %q", code, errOut)
		}
		if err := os.Chmod(f, 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := l.run("", nil, "bcd-node", append(joinArgs(dir, serving, signing, enc), "--token-file", f)...)
		if code != 0 || !joinedRe.MatchString(out) {
			t.Fatalf("token file join: exit %d, %q %q", code, out, errOut)
		}
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("the token file was not removed after the join")
		}
	})

	t.Run("uses exceeded", func(t *testing.T) {
		// The token's one use went to the token file join above.
		dir := filepath.Join(l.root, "second")
		code, _, errOut := l.run("", []string{"BCD_JOIN_TOKEN=" + tok}, "bcd-node", joinArgs(dir, serving, signing, enc)...)
		if code != 1 || !strings.Contains(errOut, "Join refused") || !strings.Contains(errOut, "no uses left") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("site refuses a node identity", func(t *testing.T) {
		tok2 := l.token(g, "--uses", "2")
		cfg, _ := l.joinNode(g, "asnode", tok2, "node")
		code, _, errOut := l.run("", nil, "bcd-site", "site", "--config", cfg)
		if code != 1 || !strings.Contains(errOut, "this data directory holds a node identity; join with a site token (bcd join --role site)") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		// A node token does not admit a site.
		dir := filepath.Join(l.root, "site")
		code, _, errOut = l.run(tok2+"\n", nil, "bcd-site", append(joinArgs(dir, serving, signing, enc), "--role", "site")...)
		if code != 1 || !strings.Contains(errOut, "does not allow this role") {
			t.Fatalf("node token for a site: exit %d, stderr %q", code, errOut)
		}
		l.out.assertAbsent(t, "the second token", tok2)
	})

	t.Run("provisioned", func(t *testing.T) {
		// An OS a deploy installed: a provisioned token for web-01 and
		// bcd join --node-id (the provisioned attestor).
		ptok := l.token(g, "--node-id", "web-01")
		f := filepath.Join(l.root, "ptoken")
		os.WriteFile(f, []byte(ptok+"\n"), 0o600)
		dir := filepath.Join(l.root, "provisioned")
		args := append(joinArgs(dir, serving, signing, enc), "--token-file", f)
		// Without --node-id the provisioned token is refused (and kept).
		code, _, errOut := l.run("", nil, "bcd-node", args...)
		if code != 1 || !strings.Contains(errOut, "provisioned attestor") {
			t.Fatalf("provisioned token without --node-id: exit %d, stderr %q", code, errOut)
		}
		if _, err := os.Stat(f); err != nil {
			t.Fatal("a refused join removed the token file")
		}
		code, out, errOut := l.run("", nil, "bcd-node", append(args, "--node-id", "web-01")...)
		if code != 0 || !strings.HasPrefix(out, "joined as web-01 (site lab, role node)") {
			t.Fatalf("provisioned join: exit %d, %q %q", code, out, errOut)
		}
		// Every boot runs it again: the same node id exits 0 without a
		// token, another is refused.
		code, out, _ = l.run("", nil, "bcd-node", append(joinArgs(dir, serving, signing, enc), "--node-id", "web-01")...)
		if code != 0 || !strings.HasPrefix(out, "already joined as web-01") {
			t.Fatalf("rerun: exit %d, %q", code, out)
		}
		code, _, errOut = l.run("", nil, "bcd-node", append(joinArgs(dir, serving, signing, enc), "--node-id", "web-02")...)
		if code != 1 || !strings.Contains(errOut, "already joined as web-01, not --node-id web-02") {
			t.Fatalf("another node id: exit %d, stderr %q", code, errOut)
		}
		code, _, errOut = l.run("", nil, "bcd-node", append(joinArgs(dir, serving, signing, enc), "--node-id", "web-01", "--role", "site")...)
		if code != 2 {
			t.Fatalf("--node-id with --role site: exit %d, stderr %q", code, errOut)
		}
		l.out.assertAbsent(t, "the provisioned token", ptok)
	})

	l.out.assertAbsent(t, "the join token", tok)
}

// TestRoleCommands: exit codes and lines of the command frame in the real
// binaries.
func TestRoleCommands(t *testing.T) {
	l := newLab(t)
	for _, tc := range []struct {
		bin  string
		args []string
		code int
		want string
	}{
		{"bcd-node", nil, 2, "usage"},
		{"bcd-node", []string{"help"}, 0, "join"},
		{"bcd-node-host", []string{"help"}, 0, "not in this build: helper, ramdisk, sim, site\n"},
		{"bcd-node", []string{"version"}, 0, "(node)"},
		{"bcd-node", []string{"site"}, 2, "bcd site: not in this build (node)"},
		{"bcd-site", []string{"node"}, 2, "bcd node: not in this build (site)"},
		{"bcd-site", []string{"sim"}, 2, "bcd sim: needs a fakehw build"},
		{"bcd-node", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"bcd-node", []string{"node", "--config", "/nonexistent/config.toml"}, 1, "config.toml"},
	} {
		code, out, errOut := l.run("", nil, tc.bin, tc.args...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%s %v: exit %d (want %d), output %q (want %q)", tc.bin, tc.args, code, tc.code, out+errOut, tc.want)
		}
	}
}

// TestJoinReset: --reset without --yes lists what it would move and exits
// 2; with --yes it moves the identity aside and the node joins anew.
func TestJoinReset(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "2")
	cfg, id := l.joinNode(g, "n", tok, "node")
	code, _, errOut := l.run("", nil, "bcd-node", "join", "--config", cfg, "--reset")
	if code != 2 || !strings.Contains(errOut, "identity.json") || !strings.Contains(errOut, "--yes") {
		t.Fatalf("--reset without --yes: exit %d, %q", code, errOut)
	}
	code, out, errOut := l.run(tok+"\n", nil, "bcd-node", "join", "--config", cfg, "--reset", "--yes")
	m := joinedRe.FindStringSubmatch(out)
	if code != 0 || m == nil || m[1] == id {
		t.Fatalf("--reset --yes: exit %d, %q %q (old node %s)", code, out, errOut, id)
	}
	aside, _ := filepath.Glob(filepath.Join(filepath.Dir(cfg), "data", "identity.json.reset-*"))
	if len(aside) != 1 {
		t.Fatalf("identity moved aside: %v", aside)
	}
	l.out.assertAbsent(t, "the join token", tok)
}

// TestJoinHandsIdentityToHelperUser: on a [helper] host bcd join (root)
// hands the data directory and identity to the unprivileged node account,
// and keeps the JoinResponse it verified in root's [helper] state_dir.
func TestJoinHandsIdentityToHelperUser(t *testing.T) {
	testenv.NeedRoot(t, "to create a user and chown")
	name := fmt.Sprintf("bcdj%d", os.Getpid()%100000)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	// A config.toml as bootstrapped by a join, then given [helper] and a
	// data directory of its own: this host's node joins with it as root.
	first, _ := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	b, _ := os.ReadFile(first)
	dir := filepath.Join(l.root, "h")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	jwk, _ := os.ReadFile(filepath.Join(filepath.Dir(first), "join-encryption.jwk"))
	if err := os.WriteFile(filepath.Join(dir, "join-encryption.jwk"), jwk, 0o644); err != nil {
		t.Fatal(err)
	}
	b = regexp.MustCompile(`(?m)^data_dir = .*$`).ReplaceAll(b, []byte(fmt.Sprintf("data_dir = %q", filepath.Join(dir, "data"))))
	cfg := filepath.Join(dir, "config.toml")
	state := filepath.Join(l.root, "helper-state")
	if err := os.WriteFile(cfg, append(b, []byte(fmt.Sprintf("\n[helper]\nsocket = \"/run/bcd-helper/helper.sock\"\nuser = %q\nstate_dir = %q\n", name, state))...), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := l.run(l.token(g, "--uses", "1")+"\n", nil, "bcd-node", "join", "--config", cfg)
	m := joinedRe.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("join: %d %s %s", code, out, errOut)
	}
	// Root keeps the JoinResponse it verified: bcd helper binds to it.
	c, err := config.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if b := anchor.Check(state, c.JoinSigningKeyPin, m[1]); b.State != "ok" || b.NodeID != m[1] {
		t.Errorf("root's join record: %+v", b)
	}
	if st, err := os.Stat(filepath.Join(state, anchor.RecordFile)); err != nil || st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("join-record.json: %v %v", st, err)
	}
	for _, f := range []string{"", "identity.json", "node.key"} {
		st, err := os.Stat(filepath.Join(filepath.Dir(cfg), "data", f))
		if err != nil {
			t.Fatal(err)
		}
		if uid := fmt.Sprint(st.Sys().(*syscall.Stat_t).Uid); uid != u.Uid {
			t.Errorf("data/%s owned by uid %s, want %s", f, uid, u.Uid)
		}
	}
}
