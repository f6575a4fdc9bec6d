package e2e

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/pki"
)

// approver writes an approver's key pair: the private key (0600, for the
// approver's machine) and the public key PEM (for bcgw).
func (l *lab) approver(name string) (priv, pub string) {
	l.t.Helper()
	k, _ := pki.GenerateKey()
	b, _ := pki.MarshalPrivateKeyPEM(k)
	priv = filepath.Join(l.root, name+".key")
	if err := os.WriteFile(priv, b, 0o600); err != nil {
		l.t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(k.Public())
	pub = filepath.Join(l.root, name+".pub")
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		l.t.Fatal(err)
	}
	return priv, pub
}

// offline runs a bcgw command that needs no data dir (an approver's
// machine) with stdin, returning stdout.
func (l *lab) offline(stdin string, args ...string) string {
	l.t.Helper()
	code, out, errOut := l.run(stdin, nil, "bcgw", args...)
	if code != 0 {
		l.t.Fatalf("bcgw %v: exit %d %s", args, code, errOut)
	}
	return out
}

// approverStatus is bcd status --json's approver set.
func (l *lab) approverEpoch(cfg string) (uint64, string) {
	l.t.Helper()
	var st struct {
		SignedIntent struct {
			Approvers *struct {
				Epoch uint64 `json:"epoch"`
			} `json:"approvers"`
			Refused string `json:"approvers_refused"`
		} `json:"signed_intent"`
	}
	_, out, _ := l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
	_ = json.Unmarshal([]byte(out), &st)
	if st.SignedIntent.Approvers == nil {
		return 0, st.SignedIntent.Refused
	}
	return st.SignedIntent.Approvers.Epoch, st.SignedIntent.Refused
}

func (l *lab) waitApproverEpoch(cfg string, cond func(epoch uint64, refused string) bool) {
	l.t.Helper()
	end := time.Now().Add(30 * time.Second)
	for time.Now().Before(end) {
		if e, r := l.approverEpoch(cfg); cond(e, r) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	e, r := l.approverEpoch(cfg)
	l.t.Fatalf("approver set: epoch %d, refused %q", e, r)
}

func resets(dataDir string) int {
	b, _ := os.ReadFile(filepath.Join(dataDir, "fakehw", "gpu-resets.log"))
	return strings.Count(string(b), "\n")
}

// batchResults submits a batch file and returns each command's view.
func (l *lab) submitBatch(g *gw, batch string) []cmdView {
	l.t.Helper()
	in := filepath.Join(l.root, "batch-submit.json")
	os.WriteFile(in, []byte(batch), 0o600)
	_, out, errOut := l.run("", nil, "bcgw", "batch", "submit", "--in", in, "--wait", "--data-dir", g.dataDir)
	var vs []cmdView
	if err := json.Unmarshal([]byte(out), &vs); err != nil {
		l.t.Fatalf("bcgw batch submit: %v: %s %s", err, out, errOut)
	}
	return vs
}

// TestDestructiveBatchQuorum: with a 2-of-3 approver set in the trust
// bundle, a destructive command (gpu.reset on the fakehw node) that bcgw
// signed but no batch carries is BATCH_UNAPPROVED; a batch with one
// approval too; with two it runs once; the same leaf sent again under
// another command id is refused, also after a node restart; an approver
// set change endorsed by one held approver is refused, the old quorum
// still holds and the new keys approve nothing.
func TestDestructiveBatchQuorum(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	a, aPub := l.approver("a")
	b, bPub := l.approver("b")
	_, cPub := l.approver("c")
	set := l.bcgw(g, "trust", "approvers", "propose", "--threshold", "2", "--key", aPub, "--key", bPub, "--key", cPub)
	l.bcgw(g, "trust", "approvers", "set", "--in", l.writeJSON("set.json", json.RawMessage(set)))
	l.waitApproverEpoch(cfg, func(e uint64, _ string) bool { return e == 1 })

	// The GPU to reset: the fake machine's first.
	var gpus struct {
		GPUs []struct{ UUID string } `json:"gpus"`
	}
	_, out, _ := l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
	json.Unmarshal([]byte(out), &gpus)
	body := `{"gpu":"` + gpus.GPUs[0].UUID + `"}`

	if code, v := l.runKind(g, id, "gpu.reset", body); code == 0 || v.Status != "BATCH_UNAPPROVED" {
		t.Fatalf("a destructive command outside a batch: exit %d %+v", code, v)
	}
	batchOf := func(batchID, cmdName string, approvers ...string) string {
		p := l.prepare(g, id, "gpu.reset", "--body", body)
		pf := l.writeJSON(cmdName+".json", p)
		bt := l.offline("", "batch", "create", "--id", batchID, "--expires", "1h", "--command", pf)
		for _, k := range approvers {
			bt = l.offline(bt, "batch", "approve", "--key", k, "--in", "-")
		}
		return bt
	}
	if vs := l.submitBatch(g, batchOf("b-one", "one", a)); len(vs) != 1 || vs[0].Status != "BATCH_UNAPPROVED" || !strings.Contains(vs[0].Error, "1 valid approvals") {
		t.Fatalf("one approval: %+v", vs)
	}
	if n := resets(data); n != 0 {
		t.Fatalf("%d resets before an approved batch", n)
	}
	approved := batchOf("b-two", "two", a, b)
	vs := l.submitBatch(g, approved)
	if len(vs) != 1 || vs[0].Status != "SUCCEEDED" {
		t.Fatalf("two approvals: %+v", vs)
	}
	// The result is attested by the node key (bcgw keeps an attestation
	// only once it verified under the node's certificate).
	if !vs[0].Attested || len(vs[0].Attestation) != 64 {
		t.Errorf("a destructive kind's SUCCEEDED result is not attested: %+v", vs[0])
	}
	if n := resets(data); n != 1 {
		t.Fatalf("%d resets after an approved batch, want 1", n)
	}

	// The same leaf under another command id: refused, also after a
	// restart of the node.
	again := func(newID string) cmdView {
		var bf map[string]any
		json.Unmarshal([]byte(approved), &bf)
		cmds := bf["commands"].([]any)
		cmds[0].(map[string]any)["id"] = newID
		nb, _ := json.Marshal(bf)
		vs := l.submitBatch(g, string(nb))
		return vs[0]
	}
	if v := again("cmd_replayaaaaaaaaaaaaaab"); v.Status != "BATCH_UNAPPROVED" || !strings.Contains(v.Error, "already ran") {
		t.Errorf("the leaf again: %+v", v)
	}
	node.signal(syscall.SIGTERM)
	node.wait(t, 15*time.Second)
	node = l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected again", func(n nodeView) bool { return n.Connected })
	if v := again("cmd_replayaaaaaaaaaaaaaac"); v.Status != "BATCH_UNAPPROVED" || !strings.Contains(v.Error, "already ran") {
		t.Errorf("the leaf again after a restart: %+v", v)
	}
	if n := resets(data); n != 1 {
		t.Errorf("%d resets, want 1: a leaf ran twice", n)
	}

	// A new set (d alone) endorsed by one held approver: the node keeps
	// epoch 1; d approves nothing; a and b still do.
	d, dPub := l.approver("d")
	next := l.bcgw(g, "trust", "approvers", "propose", "--threshold", "1", "--key", dPub)
	next = l.offline(next, "trust", "approvers", "endorse", "--key", a, "--in", "-")
	code, _, errOut := l.run("", nil, "bcgw", "trust", "approvers", "set", "--in", l.writeJSON("next.json", json.RawMessage(next)), "--data-dir", g.dataDir)
	if code != 0 || !strings.Contains(errOut, "keep it") {
		t.Errorf("an under-endorsed set: exit %d, warning %q", code, errOut)
	}
	l.waitApproverEpoch(cfg, func(e uint64, refused string) bool { return e == 1 && strings.Contains(refused, "endorsed by 1") })
	if vs := l.submitBatch(g, batchOf("b-new", "new", d)); vs[0].Status != "BATCH_UNAPPROVED" {
		t.Errorf("approved by the refused set's key: %+v", vs)
	}
	if vs := l.submitBatch(g, batchOf("b-old", "old", a, b)); vs[0].Status != "SUCCEEDED" {
		t.Errorf("the held quorum: %+v", vs)
	}
	if n := resets(data); n != 2 {
		t.Errorf("%d resets, want 2", n)
	}
	l.out.assertAbsent(t, "an approver's key", strings.TrimSpace(readFile(t, a)))
}
