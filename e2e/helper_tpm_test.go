package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/anchor"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
	"github.com/better-compute/bcd/components/trust/wellknown"
)

// TestUnprivilegedNodeRenewsThroughHelperTPM runs the whole unprivileged
// TPM flow with the real binaries as processes: a swtpm whose EK is
// enrolled with bcgw; bcd join --attestor tpm as root, which hands the
// identity to [helper] user; bcd helper (fakehw, its TPM the swtpm) as
// root; and bcd node as that real unprivileged user, which never opens the
// TPM and keeps its key there through the helper's tpm.* operations. The
// node connects, renews with the AK's certification (bcgw refuses an AK
// node's renewal without one), answers agent.ping after the renewal, and
// says its key is in the TPM; node.key holds the TPM record, and no output
// shows a private key.
func TestUnprivilegedNodeRenewsThroughHelperTPM(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.NeedRoot(t, "it creates a user with useradd, runs bcd join and bcd helper as root")
	}
	if _, err := exec.LookPath("swtpm"); err != nil && os.Getenv("CI") == "" {
	}
	swtpmtest.Need(t) // skips without swtpm, fails under CI=true
	for _, tool := range []string{"useradd", "userdel"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Skip(t, "needs %s: %v (apt-get install passwd)", tool, err)
		}
	}
	start := time.Now()
	l := newLab(t)

	// A base directory root owns alone, that the user can traverse: the
	// helper refuses a socket, configuration or entrypoint under a
	// directory others can write, as /tmp (t.TempDir) is.
	base, err := os.MkdirTemp("/run", "bcd-e2e-helper-tpm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	for _, d := range []string{"", "bin", "etc"} {
		if d != "" {
			if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// The unprivileged user, with its own primary group (the helper's
	// socket group).
	name := "bcdh" + randHex(t, 4)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
		if _, err := user.LookupGroup(name); err == nil {
			exec.Command("groupdel", name).Run()
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)

	// The installed binaries: bcd-node (fakehw, the [helper] entrypoint)
	// and a fakehw bcd-helper, in root's directory.
	bin := filepath.Join(base, "bin")
	copyExe(t, filepath.Join(l.bin, "bcd-node"), filepath.Join(bin, "bcd-node"))
	buildHelper(t, filepath.Join(bin, "bcd-helper"))
	root := &lab{t: t, bin: bin, root: l.root, out: l.out}
	asUser := &lab{t: t, bin: bin, root: l.root, out: l.out, cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}

	// 1. swtpm, bcgw, the EK enrolled.
	sw := swtpmtest.Start(t, "")
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	ekFile := filepath.Join(l.root, "ek.pem")
	akName := ekAndAK(t, sw.Addr, ekFile)
	if out := l.bcgw(g, "tpm", "enroll", "--ek-pub", ekFile, "--site", "lab"); !strings.HasPrefix(out, "enrolled EK sha256/") {
		t.Fatalf("bcgw tpm enroll printed %q", out)
	}

	// 2. config.toml: root's, 0644, with [helper].
	var doc wellknown.Document
	if err := json.Unmarshal([]byte(l.bcgw(g, "well-known")), &doc); err != nil || doc.Gateway.URL == "" || doc.Pins.ServingCA == "" || doc.Gateway.ServerName == "" {
		t.Fatalf("bcgw well-known: %+v %v", doc, err)
	}
	dataDir := filepath.Join(base, "data")
	statusDir := filepath.Join(base, "status") // the node's, 0700
	if err := os.Mkdir(statusDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(statusDir, uid, gid); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(base, "run", "helper.sock")
	cfg := filepath.Join(base, "etc", "config.toml")
	toml := fmt.Sprintf("gateway = %q\ngateway_server_name = %q\nserving_ca_spki_pin = %q\njoin_signing_key_pin = %q\njoin_encryption_key_pin = %q\n"+
		"data_dir = %q\nsocket_path = %q\n\n[helper]\nsocket = %q\nuser = %q\nentrypoint = %q\nstate_dir = %q\n",
		doc.Gateway.URL, doc.Gateway.ServerName, doc.Pins.ServingCA, doc.Pins.JoinSigning, doc.Pins.JoinEncryption,
		dataDir, filepath.Join(statusDir, "bcd.sock"), socket, name, filepath.Join(bin, "bcd-node"), filepath.Join(base, "hstate"))
	if err := os.WriteFile(cfg, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}

	// 3. bcd join --attestor tpm as root, which exits (and so lets go of
	// the swtpm, which serves one connection at a time) before the helper
	// opens it; it hands the identity to the user.
	tpmEnv := []string{"BCD_FAKEHW_SWTPM=" + sw.Addr}
	code, out, errOut := root.run("", tpmEnv, "bcd-node", "join", "--attestor", "tpm", "--config", cfg)
	m := joinedRe.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("bcd join --attestor tpm: exit %d %q %s", code, out, errOut)
	}
	if b := anchor.Check(filepath.Join(base, "hstate"), doc.Pins.JoinSigning, m[1]); b.State != "ok" {
		t.Errorf("root's join record after a tpm join: %+v", b)
	}
	id := m[1]
	// Everything the join wrote is the user's.
	handed := 0
	if err := filepath.Walk(dataDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("%s belongs to %d:%d after the join, want %s's %d:%d", p, st.Uid, st.Gid, name, uid, gid)
		}
		if rel, _ := filepath.Rel(dataDir, p); rel == identity.IdentityFile || rel == identity.KeyFile {
			handed++
		}
		return nil
	}); err != nil || handed != 2 {
		t.Fatalf("the data directory after the join: %v, identity.json and node.key found: %d", err, handed)
	}
	joinedKey, err := os.ReadFile(filepath.Join(dataDir, identity.KeyFile))
	if err != nil || !strings.HasPrefix(string(joinedKey), `{"tpm":{"unique":"`) {
		t.Fatalf("node.key after the join %q %v, want the record of a key in the TPM", joinedKey, err)
	}
	joined, err := identity.Load(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	joinedSerial := joined.Cert.SerialNumber.Text(16)
	before := nodeNotAfter(t, l, g, id)

	// 4. bcd helper as root (its TPM the swtpm), then bcd node as the user.
	helper := root.startEnv(tpmEnv, "bcd-helper", "helper", "--config", cfg)
	helper.waitLog(t, "helper: listening", 10*time.Second)
	node := asUser.startEnv(append(tpmEnv, "BCD_RENEW_AFTER=3s"), "bcd-node", "node", "--config", cfg)
	node.waitLog(t, "bcd node runs beside bcd helper: node keys in the TPM go through the helper's tpm.* operations", 10*time.Second)

	// 5. It connects, then renews with the AK's certification.
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	node.waitLog(t, "certificate renewed", 20*time.Second)
	if m := g.waitLog(t, "node renewed", 5*time.Second); m["node"] != id {
		t.Errorf("bcgw renewed node %v, want %s", m["node"], id)
	}
	if strings.Contains(g.stderr.String(), "renewal refused") {
		t.Errorf("bcgw refused a renewal:\n%s", g.stderr.String())
	}
	l.waitNode(g, id, "reconnected after renewal", func(n nodeView) bool { return n.Connected && n.Epoch >= 2 })
	if after := nodeNotAfter(t, l, g, id); !after.After(before) {
		t.Errorf("bcgw nodes: not_after %s after the renewal, was %s", after, before)
	}
	if h := asUser.statusKeyHolder(cfg); h != identity.KeyInTPM {
		t.Errorf("bcd status (as %s) key holder %q, want %q", name, h, identity.KeyInTPM)
	}
	if code, out, errOut := l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", g.dataDir); code != 0 {
		t.Fatalf("agent.ping after the renewal: exit %d %s %s", code, out, errOut)
	}

	// A GPU hold binds through the helper (file.write of the CDI spec and
	// environment file, checked by the helper against its own GPUs) and
	// its release removes them (file.remove).
	alloc := fmt.Sprintf("e2e_%d", os.Getpid())
	cdiPath, envPath := "/etc/cdi/bcd-"+alloc+".json", "/run/bcd-alloc/"+alloc+".env"
	t.Cleanup(func() { os.Remove(cdiPath); os.Remove(envPath) })
	holdGen, _ := strconv.ParseUint(strings.TrimSpace(l.bcgw(g, "hold", id, "--alloc", alloc, "--gpu", "0")), 10, 64)
	l.waitStatus(g, id, "the hold bound", func(s adminapi.StatusView) bool { return s.ObservedGeneration >= holdGen })
	if b, err := os.ReadFile(cdiPath); err != nil || !strings.Contains(string(b), `"name": "`+alloc+`"`) {
		t.Errorf("the hold's CDI spec through the helper: %v %s", err, b)
	}
	if st, err := os.Stat(envPath); err != nil || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the hold's environment file: %v (written by root through the helper)", err)
	}
	relGen, _ := strconv.ParseUint(strings.TrimSpace(l.bcgw(g, "release", id, "--alloc", alloc)), 10, 64)
	l.waitStatus(g, id, "the hold released", func(s adminapi.StatusView) bool { return s.ObservedGeneration >= relGen })
	if _, err := os.Stat(cdiPath); err == nil {
		t.Error("the released hold's CDI spec is still there")
	}
	fileOps := map[string]int{}
	for _, o := range helperOps(t, helper.stderr.String()) {
		if op, _ := o["op"].(string); strings.HasPrefix(op, "file.") && o["outcome"] == "ok" {
			fileOps[op]++
		}
	}
	if fileOps["file.write"] != 2 || fileOps["file.remove"] != 2 {
		t.Errorf("the helper log shows file operations %v, want two writes and two removes", fileOps)
	}

	// The helper served the node's process: its key loaded, the next key
	// made and certified by the AK, each from the node's pid and uid.
	ops := helperOps(t, helper.stderr.String())
	nodePid := float64(node.cmd.Process.Pid)
	seen := map[string]map[string]bool{}
	for _, o := range ops {
		if o["pid"] != nodePid || o["uid"] != float64(uid) {
			t.Errorf("helper operation from pid %v uid %v, want only the node's (pid %v uid %d): %v", o["pid"], o["uid"], nodePid, uid, o)
			continue
		}
		if o["outcome"] != "ok" {
			t.Errorf("helper operation not ok: %v", o)
		}
		op, _ := o["op"].(string)
		key, _ := o["key"].(string)
		if strings.HasPrefix(op, "file.") {
			continue
		}
		if seen[op] == nil {
			seen[op] = map[string]bool{}
		}
		seen[op][key] = true
	}
	t.Logf("helper operations from the node (pid %v, uid %d), by operation and key: %v", nodePid, uid, seen)

	node.signal(syscall.SIGTERM)
	if c := node.wait(t, 15*time.Second); c != 0 {
		t.Errorf("bcd node exited %d on SIGTERM", c)
	}

	// node.key is the new key's TPM record, the certificate names the AK,
	// and bcgw's store holds the renewed certificate.
	raw, err := os.ReadFile(filepath.Join(dataDir, identity.KeyFile))
	if err != nil || string(raw) == string(joinedKey) || !strings.HasPrefix(string(raw), `{"tpm":{"unique":"`) || strings.Contains(string(raw), "PRIVATE KEY") {
		t.Errorf("node.key after the renewal %q %v, want a new TPM key's record", raw, err)
	}
	// The helper derived the joined key and the renewed one, and the AK
	// certified the renewed one.
	was, now := tpmKeyID(t, joinedKey), tpmKeyID(t, raw)
	if !seen["tpm.nodekey"][was] || !seen["tpm.nodekey"][now] || len(seen["tpm.certify"]) != 1 || !seen["tpm.certify"][now] || len(seen["tpm.ak"]) == 0 {
		t.Errorf("the helper log should show tpm.nodekey of the joined key %s and the renewed %s, tpm.ak, and tpm.certify of %s alone, from the node; it shows %v\n%s",
			was, now, now, seen, helper.stderr.String())
	}
	renewed, err := identity.Load(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if ak, _ := identity.CertAK(renewed.Cert); hex.EncodeToString(ak) != akName {
		t.Errorf("the renewed certificate names AK %x, want %s", ak, akName)
	}
	serial := renewed.Cert.SerialNumber.Text(16)
	g.signal(syscall.SIGTERM)
	g.wait(t, 15*time.Second)
	st, err := store.Open(filepath.Join(g.dataDir, "bcgw.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.Node(id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.CertSerial == joinedSerial || rec.CertSerial != serial {
		t.Errorf("bcgw's store: cert serial %s (joined with %s), want the renewed %s", rec.CertSerial, joinedSerial, serial)
	}

	l.out.assertAbsent(t, "a private key PEM header", "PRIVATE KEY")
	t.Logf("the unprivileged node renewed through the helper's TPM in %s", time.Since(start).Round(time.Millisecond))
}

// nodeNotAfter answers bcgw nodes --json's not_after of id.
func nodeNotAfter(t *testing.T, l *lab, g *gw, id string) time.Time {
	t.Helper()
	var ns []struct {
		ID       string    `json:"id"`
		NotAfter time.Time `json:"not_after"`
	}
	if err := json.Unmarshal([]byte(l.bcgw(g, "nodes", "--json")), &ns); err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.ID == id {
			return n.NotAfter
		}
	}
	t.Fatalf("bcgw nodes has no %s", id)
	return time.Time{}
}

// tpmKeyID answers the helper log's name of the key a node.key record
// holds: the hex of its unique's first 8 bytes.
func tpmKeyID(t *testing.T, record []byte) string {
	t.Helper()
	var r struct {
		TPM struct {
			Unique []byte `json:"unique"`
		} `json:"tpm"`
	}
	if err := json.Unmarshal(record, &r); err != nil || len(r.TPM.Unique) != 32 {
		t.Fatalf("node.key %q is not a TPM record: %v", record, err)
	}
	return hex.EncodeToString(r.TPM.Unique[:8])
}

// helperOps answers the helper's "helper: operation" log lines.
func helperOps(t *testing.T, log string) []map[string]any {
	t.Helper()
	var ops []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "helper: operation" {
			ops = append(ops, m)
		}
	}
	return ops
}

// buildHelper builds a fakehw bcd-helper (its TPM is $BCD_FAKEHW_SWTPM)
// into out.
func buildHelper(t *testing.T, out string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "fakehw", "-o", out, "./roles/helper")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./roles/helper: %v\n%s", err, b)
	}
	if err := os.Chmod(out, 0o755); err != nil {
		t.Fatal(err)
	}
}

// copyExe copies an executable to a new file, mode 0755.
func copyExe(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func randHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
