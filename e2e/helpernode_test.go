package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/anchor"
)

// helperNode is a node joined with [helper]: a throwaway system account
// for bcd node, root's join record in the helper's own state directory
// (under the test's, never the system path), the node's identity the
// account's.
type helperNode struct {
	name     string // the node account
	uid, gid int
	bin      string // bcd-node (the helper's entrypoint) and bcd-helper
	root     *lab   // runs as root
	asUser   *lab   // runs as the node account
	cfg      string // root's config.toml, readable by the account
	dataDir  string
	state    string // [helper] state_dir
	sock     string // [helper] socket
	id       string // the node id
}

// newHelperNode makes the account, copies nodeBin (a binary of l.bin) as
// the entrypoint, builds bcd-helper with tags, and joins to g twice: a
// first join writes config.toml, which then gets [helper] and extra,
// and a join as root keeps the join record the helper binds to.
func newHelperNode(t *testing.T, l *lab, g *gw, base, nodeBin, tags, extra string) *helperNode {
	t.Helper()
	testenv.NeedTool(t, "useradd", "passwd")
	for _, d := range []string{"bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h := &helperNode{name: "bcdh" + randHex(t, 4), bin: filepath.Join(base, "bin")}
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", h.name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", h.name).Run(); exec.Command("groupdel", h.name).Run() })
	u, err := user.Lookup(h.name)
	if err != nil {
		t.Fatal(err)
	}
	h.uid, _ = strconv.Atoi(u.Uid)
	h.gid, _ = strconv.Atoi(u.Gid)
	copyExe(t, filepath.Join(l.bin, nodeBin), filepath.Join(h.bin, "bcd-node"))
	args := []string{"build", "-trimpath"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, "-o", filepath.Join(h.bin, "bcd-helper"), "./roles/helper")...)
	cmd.Dir, cmd.Env = "..", append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./roles/helper: %v\n%s", err, b)
	}
	h.root = &lab{t: t, bin: h.bin, root: l.root, out: l.out}
	h.asUser = &lab{t: t, bin: h.bin, root: l.root, out: l.out, cred: &syscall.Credential{Uid: uint32(h.uid), Gid: uint32(h.gid)}}

	pinArgs := strings.Fields(l.bcgw(g, "well-known", "--pins"))
	h.dataDir = filepath.Join(base, "data")
	statusDir := filepath.Join(base, "status")
	os.Mkdir(statusDir, 0o700)
	os.Chown(statusDir, h.uid, h.gid)
	h.cfg = filepath.Join(base, "etc", "config.toml")
	join := append([]string{"join", "--config", h.cfg, "--server", "https://" + g.addr, "--data-dir", filepath.Join(base, "data0")}, pinArgs...)
	if code, out, errOut := h.root.run(l.token(g, "--uses", "1")+"\n", nil, "bcd-node", join...); code != 0 {
		t.Fatalf("bcd join: exit %d %q %s", code, out, errOut)
	}
	b, _ := os.ReadFile(h.cfg)
	b = socketRe.ReplaceAll(b, []byte(fmt.Sprintf("socket_path = %q", filepath.Join(statusDir, "bcd.sock"))))
	b = regexp.MustCompile(`(?m)^data_dir = .*$`).ReplaceAll(b, []byte(fmt.Sprintf("data_dir = %q", h.dataDir)))
	h.state = filepath.Join(base, "hstate")
	h.sock = filepath.Join(base, "run", "helper.sock")
	b = append(b, []byte(fmt.Sprintf("\n[helper]\nsocket = %q\nuser = %q\nentrypoint = %q\nstate_dir = %q\n",
		h.sock, h.name, filepath.Join(h.bin, "bcd-node"), h.state))...)
	b = append(b, []byte(extra)...)
	if err := os.WriteFile(h.cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := h.root.run(l.token(g, "--uses", "1")+"\n", nil, "bcd-node", "join", "--config", h.cfg)
	m := joinedRe.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("bcd join with [helper]: exit %d %q %s", code, out, errOut)
	}
	h.id = m[1]
	if c, err := config.Load(h.cfg); err != nil || anchor.Check(h.state, c.JoinSigningKeyPin, h.id).State != "ok" {
		t.Fatalf("root's join record for %s: %v %+v", h.id, err, anchor.Check(h.state, c.JoinSigningKeyPin, h.id))
	}
	os.Chmod(h.cfg, 0o644) // root's, readable by the node account
	os.Chmod(h.dataDir, 0o700)
	// The identity is the node account's.
	filepath.Walk(h.dataDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			os.Chown(p, h.uid, h.gid)
		}
		return nil
	})
	return h
}
