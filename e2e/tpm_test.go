package e2e

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

// ekAndAK reads a swtpm's EK (written to file as a PEM public key) and its
// AK's name, then lets go of the swtpm (it serves one connection at a time).
func ekAndAK(t *testing.T, addr, file string) (akName string) {
	t.Helper()
	tp, err := nodetpm.OpenTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	ek, err := tp.EKPublicPEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, ek, 0o644); err != nil {
		t.Fatal(err)
	}
	akPub, err := tp.AKPublic()
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(join.AKName(akPub))
}

type tpmNodeView struct {
	ID string `json:"id"`
	AK string `json:"ak"`
}

// statusKeyHolder asks the running agent what holds its key.
func (l *lab) statusKeyHolder(cfg string) string {
	l.t.Helper()
	code, out, errOut := l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
	var st struct {
		KeyHolder string `json:"key_holder"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		l.t.Fatalf("status --json: exit %d %v %s %s", code, err, out, errOut)
	}
	return st.KeyHolder
}

// doctorNodeKey runs bcd doctor and answers its node key line.
func (l *lab) doctorNodeKey(cfg string, env []string) (status, detail string) {
	l.t.Helper()
	_, out, errOut := l.run("", env, "bcd-node", "doctor", "--config", cfg, "--json")
	var results []struct{ Name, Status, Detail string }
	if err := json.Unmarshal([]byte(out), &results); err != nil {
		l.t.Fatalf("doctor --json: %v %s %s", err, out, errOut)
	}
	for _, r := range results {
		if r.Name == "node key" {
			return r.Status, r.Detail
		}
	}
	l.t.Fatalf("doctor has no node key check: %s", out)
	return "", ""
}

// TestTPMJoin: bcd join --attestor tpm (a fakehw bcd-node whose TPM is a
// swtpm the test started) against a real bcgw process: refused until the EK
// is enrolled with bcgw tpm enroll, then joined with no token; node.key
// records the key in the TPM; bcgw nodes lists the AK; bcd node renews with
// the AK's certification, and bcd status and bcd doctor say the key is in
// the TPM.
func TestTPMJoin(t *testing.T) {
	l := newLab(t)
	sw := swtpmtest.Start(t, "")
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	ekFile := filepath.Join(l.root, "ek.pem")
	akName := ekAndAK(t, sw.Addr, ekFile)
	env := []string{"BCD_FAKEHW_SWTPM=" + sw.Addr}
	dir := filepath.Join(l.root, "n")
	cfg := filepath.Join(dir, "config.toml")
	pins := strings.Fields(l.bcgw(g, "well-known", "--pins"))
	args := append([]string{"join", "--attestor", "tpm", "--config", cfg, "--server", "https://" + g.addr, "--data-dir", filepath.Join(dir, "data")}, pins...)

	code, _, errOut := l.run("", env, "bcd-node", args...)
	if code != 1 || !strings.Contains(errOut, "Join refused: the TPM's EK sha256/") || !strings.Contains(errOut, "is not enrolled") {
		t.Fatalf("join before enrolment: exit %d %s", code, errOut)
	}
	if code, _, errOut := l.run("", env, "bcd-node", append(args, "--token-file", ekFile)...); code != 2 || !strings.Contains(errOut, "takes no --token-file") {
		t.Fatalf("--attestor tpm with --token-file: exit %d %s", code, errOut)
	}
	if out := l.bcgw(g, "tpm", "enroll", "--ek-pub", ekFile, "--site", "rack1"); !strings.HasPrefix(out, "enrolled EK sha256/") {
		t.Fatalf("bcgw tpm enroll printed %q", out)
	}
	code, out, errOut := l.run("", env, "bcd-node", args...)
	m := joinedRe.FindStringSubmatch(out)
	if code != 0 || m == nil || m[2] != "rack1" {
		t.Fatalf("join with the TPM: exit %d %q %s", code, out, errOut)
	}
	id := m[1]
	raw, err := os.ReadFile(filepath.Join(dir, "data", identity.KeyFile))
	if err != nil || !strings.HasPrefix(string(raw), `{"tpm":{"unique":"`) {
		t.Fatalf("node.key %q %v, want the record of a key in the TPM", raw, err)
	}
	var ns []tpmNodeView
	if err := json.Unmarshal([]byte(l.bcgw(g, "nodes", "--json")), &ns); err != nil || len(ns) != 1 || ns[0].ID != id || ns[0].AK != akName {
		t.Fatalf("bcgw nodes --json: %+v %v, want %s with AK %s", ns, err, id, akName)
	}
	if table := l.bcgw(g, "nodes"); !strings.Contains(table, "AK") || !strings.Contains(table, akName) {
		t.Errorf("bcgw nodes does not list the AK:\n%s", table)
	}
	b, _ := os.ReadFile(cfg)
	b = socketRe.ReplaceAll(b, []byte(`socket_path = "`+filepath.Join(dir, "run", "bcd.sock")+`"`))
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}

	node := l.startEnv(append(env, "BCD_RENEW_AFTER=500ms"), "bcd-node", "node", "--config", cfg)
	node.waitLog(t, "certificate renewed", 30*time.Second)
	l.waitNode(g, id, "reconnected after renewal", func(n nodeView) bool { return n.Connected && n.Epoch >= 2 })
	if h := l.statusKeyHolder(cfg); h != "in the TPM" {
		t.Errorf("bcd status key holder %q, want in the TPM", h)
	}
	if st, d := l.doctorNodeKey(cfg, env); st != "ok" || d != "in the TPM" {
		t.Errorf("bcd doctor node key: %s %q", st, d)
	}
	if strings.Contains(g.stderr.String(), "renewal refused") {
		t.Errorf("bcgw refused a renewal:\n%s", g.stderr.String())
	}
	raw2, _ := os.ReadFile(filepath.Join(dir, "data", identity.KeyFile))
	if string(raw2) == string(raw) || !strings.HasPrefix(string(raw2), `{"tpm":`) {
		t.Errorf("after renewal node.key is %q, want a new TPM key's record", raw2)
	}
	if code, out, _ := l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", g.dataDir); code != 0 {
		t.Fatalf("agent.ping over the TPM key: exit %d %s", code, out)
	}
	node.signal(syscall.SIGTERM)
	node.wait(t, 15*time.Second)
	a, err := identity.Load(filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	if ak, _ := identity.CertAK(a.Cert); hex.EncodeToString(ak) != akName {
		t.Errorf("the renewed certificate names AK %x, want %s", ak, akName)
	}
}

// TestFileKeyMovesIntoTPM: a node joined with a token keeps its key in a
// file; bcd doctor warns about it on a host with a TPM; its next renewal
// moves it into the TPM, and bcd status says so.
func TestFileKeyMovesIntoTPM(t *testing.T) {
	l := newLab(t)
	sw := swtpmtest.Start(t, "")
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	env := []string{"BCD_FAKEHW_SWTPM=" + sw.Addr}
	if st, d := l.doctorNodeKey(cfg, nil); st != "ok" || !strings.Contains(d, "no TPM") {
		t.Errorf("doctor node key without a TPM: %s %q", st, d)
	}
	if st, d := l.doctorNodeKey(cfg, env); st != "warn" || !strings.Contains(d, "a file key although this host has a TPM: the next renewal moves it into the TPM") {
		t.Errorf("doctor node key with a TPM: %s %q", st, d)
	}
	node := l.startEnv(append(env, "BCD_RENEW_AFTER=500ms"), "bcd-node", "node", "--config", cfg)
	node.waitLog(t, "the node key moved into the TPM", 30*time.Second)
	node.waitLog(t, "certificate renewed", 30*time.Second)
	l.waitNode(g, id, "reconnected after renewal", func(n nodeView) bool { return n.Connected && n.Epoch >= 2 })
	if h := l.statusKeyHolder(cfg); h != "in the TPM" {
		t.Errorf("bcd status key holder %q after the move, want in the TPM", h)
	}
	raw, _ := os.ReadFile(filepath.Join(filepath.Dir(cfg), "data", identity.KeyFile))
	if strings.Contains(string(raw), "PRIVATE KEY") {
		t.Error("node.key still holds a private key after the move")
	}
	if code, out, _ := l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", g.dataDir); code != 0 {
		t.Fatalf("agent.ping after the move: exit %d %s", code, out)
	}
}
