package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/quorum"
	"github.com/better-compute/bcd/components/trust/wellknown"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// approver is an approver's key files.
type approver struct {
	key, pub string
	pem      []byte
	spki     []byte
}

func newApprover(t *testing.T) approver {
	t.Helper()
	k, p, pemKey, spki := keyFiles(t)
	return approver{key: k, pub: p, pem: pemKey, spki: spki}
}

// heldBundle is the server's trust bundle, verified as an agent verifies
// it against the join-signing pin.
func heldBundle(t *testing.T, s *gateway.Server, dir string) bundle.Document {
	t.Helper()
	var d wellknown.Document
	if err := adminapi.NewClient(dir, "", "").WellKnown(context.Background(), &d); err != nil {
		t.Fatal(err)
	}
	doc, err := bundle.Verify(s.TrustBundle(), d.Pins.JoinSigning)
	if err != nil {
		t.Fatalf("the trust bundle does not verify: %v", err)
	}
	if _, err := bundle.Decode(s.TrustBundle().GetDocument()); err != nil {
		t.Fatal(err)
	}
	return doc
}

func writeWork(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The approver set through the CLI: propose (from the held epoch), endorse
// (no data directory), set; the bundle carries it; an under-endorsed
// change warns; endorse never shows the key.
func TestApproverCommands(t *testing.T) {
	s, dir := startServer(t)
	ctx := context.Background()
	run := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		return runCLI(t, ctx, stdin, append(args, "--data-dir", dir)...)
	}
	work := t.TempDir()
	A, B, C, D := newApprover(t), newApprover(t), newApprover(t), newApprover(t)

	code, out, errOut := run("", "trust", "show")
	if code != 0 || !strings.Contains(out, "approvers  none") {
		t.Fatalf("trust show: exit %d\n%s%s", code, out, errOut)
	}
	code, proposed, errOut := run("", "trust", "approvers", "propose", "--threshold", "2", "--key", A.pub, "--key", B.pub, "--key", C.pub)
	if code != 0 || !strings.Contains(errOut, "no endorsement is needed") || !strings.Contains(proposed, `"endorsements": []`) {
		t.Fatalf("propose: exit %d %q %q", code, proposed, errOut)
	}
	var set adminapi.ApproverSet
	if json.Unmarshal([]byte(proposed), &set) != nil || set.Epoch != 1 || set.Threshold != 2 || len(set.Keys) != 3 || !bytes.Equal(set.Keys[1], B.spki) {
		t.Fatalf("proposed %s", proposed)
	}
	if code, out, errOut := run("", "trust", "approvers", "set", "--in", writeWork(t, work, "set1.json", proposed)); code != 0 || out != "2\n" || errOut != "" {
		t.Fatalf("set: exit %d %q %q", code, out, errOut)
	}
	doc := heldBundle(t, s, dir)
	if doc.Version != 2 || doc.Approvers == nil || doc.Approvers.Epoch != 1 || doc.Approvers.Threshold != 2 || len(doc.Approvers.Keys) != 3 ||
		!bytes.Equal(doc.Approvers.Keys[0], A.spki) || len(doc.CommandSigningRoots) != 1 {
		t.Fatalf("bundle %+v", doc)
	}
	code, out, _ = run("", "trust", "show")
	pinA, _ := pki.Pin(mustParse(t, A.spki))
	if code != 0 || !strings.Contains(out, "approvers  epoch 1: 2 of 3 keys approve a batch; 0 endorsements") || !strings.Contains(out, "  "+pinA+"\n") {
		t.Errorf("trust show:\n%s", out)
	}
	code, out, _ = run("", "trust", "show", "--json")
	var v adminapi.TrustView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Approvers == nil || v.Approvers.Epoch != 1 || v.Approvers.Keys[0] != pinA {
		t.Errorf("trust show --json: %s", out)
	}
	// The same set again: unchanged.
	if code, out, errOut := run(proposed, "trust", "approvers", "set"); code != 0 || out != "2\n" || !strings.Contains(errOut, "unchanged") {
		t.Errorf("the same set again: exit %d %q %q", code, out, errOut)
	}

	// Epoch 2 (the held epoch plus one), endorsed by A alone: set, with a
	// warning, since the held set needs 2.
	code, proposed2, errOut := run("", "trust", "approvers", "propose", "--threshold", "1", "--key", D.pub)
	if code != 0 || !strings.Contains(proposed2, `"epoch": 2`) || !strings.Contains(errOut, "once 2 of that set's keys endorsed it") {
		t.Fatalf("propose epoch 2: exit %d %q %q", code, proposed2, errOut)
	}
	// endorse runs without a data directory.
	code, once, errOut := runCLI(t, ctx, "", "trust", "approvers", "endorse", "--key", A.key, "--in", writeWork(t, work, "set2.json", proposed2))
	if code != 0 || !strings.Contains(errOut, "endorsed approver set epoch 2 (threshold 1 of 1 keys); it carries 1 endorsements, with the key "+pinA) {
		t.Fatalf("endorse: exit %d %q", code, errOut)
	}
	noKeyIn(t, "endorse", once+errOut, A.pem)
	code, out, errOut = run("", "trust", "approvers", "set", "--in", writeWork(t, work, "set2e.json", once), "--json")
	var ch adminapi.ApproversChange
	if code != 0 || json.Unmarshal([]byte(out), &ch) != nil || ch.Version != 3 || !ch.Changed ||
		!strings.Contains(errOut, "warning: agents that hold the approver set of epoch 1 keep it: approver set epoch 2 is endorsed by 1 of the held set's keys; it needs 2") {
		t.Fatalf("an under-endorsed set: exit %d %q %q", code, out, errOut)
	}
	// B endorses as well (from stdin): the bundle's set is epoch 2 now, so
	// no warning; the bundle carries both endorsements, and an agent
	// holding epoch 1 would take it.
	code, twice, errOut := runCLI(t, ctx, once, "trust", "approvers", "endorse", "--key", B.key)
	if code != 0 || !strings.Contains(errOut, "it carries 2 endorsements") {
		t.Fatalf("second endorse: exit %d %q", code, errOut)
	}
	noKeyIn(t, "endorse", twice+errOut, B.pem)
	if code, out, errOut := run(twice, "trust", "approvers", "set"); code != 0 || out != "4\n" || errOut != "" {
		t.Fatalf("the endorsed set: exit %d %q %q", code, out, errOut)
	}
	doc = heldBundle(t, s, dir)
	var ends [][]byte
	_ = json.Unmarshal([]byte(twice), &set)
	ends = set.Endorsements
	held, _ := (&bundle.Approvers{Epoch: 1, Threshold: 2, Keys: [][]byte{A.spki, B.spki, C.spki}}).Set()
	if doc.Approvers.Epoch != 2 || len(doc.Approvers.Endorsements) != 2 || quorum.Endorsed(held, 2, 1, doc.Approvers.Keys, ends) != nil {
		t.Errorf("bundle approvers %+v", doc.Approvers)
	}

	// Refusals, none showing a key.
	loose := filepath.Join(t.TempDir(), "loose.pem")
	_ = os.WriteFile(loose, A.pem, 0o644)
	for _, tt := range []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{proposed2, []string{"trust", "approvers", "endorse", "--key", loose}, cli.ExitFailure, "chmod 600"},
		{proposed2, []string{"trust", "approvers", "endorse"}, cli.ExitUsage, "--key is required"},
		{`{"epoch":1}`, []string{"trust", "approvers", "endorse", "--key", A.key}, cli.ExitFailure, "approver set: 0 keys; an approver set has 1 to 16"},
		{`{"hello":1}`, []string{"trust", "approvers", "endorse", "--key", A.key}, cli.ExitFailure, "not an approver set"},
		{"", []string{"trust", "approvers", "propose", "--threshold", "1", "--key", D.pub, "--epoch", "2", "--data-dir", dir}, cli.ExitFailure, "not above the held approver set's epoch 2"},
		{"", []string{"trust", "approvers", "propose", "--threshold", "2", "--key", D.pub, "--data-dir", dir}, cli.ExitFailure, "threshold 2 of 1 keys"},
		{"", []string{"trust", "approvers", "propose", "--threshold", "1", "--key", D.pub, "--key", D.pub, "--data-dir", dir}, cli.ExitFailure, "named twice"},
		{"", []string{"trust", "approvers", "propose", "--threshold", "1", "--key", A.key, "--data-dir", dir}, cli.ExitFailure, `want "PUBLIC KEY"`},
		{"", []string{"trust", "approvers", "propose", "--key", D.pub}, cli.ExitUsage, "--threshold and at least one --key"},
		{"{", []string{"trust", "approvers", "set", "--data-dir", dir}, cli.ExitFailure, "not an approver set"},
		{"", []string{"trust", "approvers", "frob"}, cli.ExitUsage, "usage: bcgw trust approvers propose"},
		{"", []string{"trust", "approvers"}, cli.ExitUsage, "usage: bcgw trust approvers propose"},
	} {
		code, out, errOut := runCLI(t, ctx, tt.stdin, tt.args...)
		if code != tt.code || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d %q, want %d and %q", tt.args, code, errOut, tt.code, tt.want)
		}
		for _, ap := range []approver{A, B} {
			noKeyIn(t, strings.Join(tt.args, " "), out+errOut, ap.pem)
		}
	}
	if v, _ := adminapi.NewClient(dir, "", "").Trust(ctx); v.Version != 4 {
		t.Errorf("version %d after refusals, want 4", v.Version)
	}
}

// frameOf is the Command frame of a stored command, as the agent gets it.
func frameOf(c store.Command) *bcdv1.Command {
	f := &bcdv1.Command{Id: c.ID, NodeId: c.NodeID, Kind: c.Kind, Body: c.Body, DeadlineUnixMs: c.DeadlineMS,
		Lane: c.Lane, WorkflowId: c.WorkflowID, Signature: c.Signature}
	if b := c.Batch; b != nil {
		f.Batch = &bcdv1.BatchLeaf{Header: b.Header, Approvals: b.Approvals, Index: b.Index, Proof: b.Proof}
	}
	return f
}

// The batch workflow through the CLI: run --prepare (one command signed
// by an external root), batch create (no data directory), approve by two
// approvers (no data directory, never showing a key), submit; each stored
// command verifies under the bundle's roots and approver set. --wait
// exits 1 when a command did not succeed. Batch file errors name what is
// wrong.
func TestBatchCommands(t *testing.T) {
	s, dir := startServer(t)
	ctx := context.Background()
	run := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		return runCLI(t, ctx, stdin, append(args, "--data-dir", dir)...)
	}
	work := t.TempDir()
	A, B, C := newApprover(t), newApprover(t), newApprover(t)
	signerKey, signerPub, signerPEM, _ := keyFiles(t)
	if code, _, errOut := run("", "trust", "add-root", "--key", signerPub); code != 0 {
		t.Fatal(errOut)
	}
	_, proposed, _ := run("", "trust", "approvers", "propose", "--threshold", "2", "--key", A.pub, "--key", B.pub, "--key", C.pub)
	if code, _, errOut := run(proposed, "trust", "approvers", "set"); code != 0 {
		t.Fatal(errOut)
	}

	prepare := func(name string, args ...string) (string, adminapi.PreparedCommand) {
		t.Helper()
		code, out, errOut := run("", append([]string{"run"}, append(args, "--deadline", "1h", "--prepare")...)...)
		var pc adminapi.PreparedCommand
		if code != 0 || json.Unmarshal([]byte(out), &pc) != nil {
			t.Fatalf("run --prepare: exit %d %q", code, errOut)
		}
		return writeWork(t, work, name, out), pc
	}
	wipeFile, wipe := prepare("wipe.json", "node_a", "disk.wipe", "--body", `{"devices": ["/dev/sdb"]}`)
	rebootFile, reboot := prepare("reboot.json", "node_a", "node.reboot")
	code, signedReboot, errOut := runCLI(t, ctx, "", "sign", "--key", signerKey, "--in", rebootFile)
	if code != 0 {
		t.Fatal(errOut)
	}
	noKeyIn(t, "sign", signedReboot, signerPEM)
	rebootFile = writeWork(t, work, "reboot.signed.json", signedReboot)

	// create runs without a data directory.
	code, batch, errOut := runCLI(t, ctx, "", "batch", "create", "--id", "lab-wipe-1", "--command", wipeFile, "--command", rebootFile, "--expires", "2h")
	if code != 0 || !strings.Contains(errOut, "batch lab-wipe-1: 2 commands") || !strings.Contains(errOut, "disk.wipe") {
		t.Fatalf("batch create: exit %d %q", code, errOut)
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal([]byte(batch), &raw) != nil || string(raw["approvals"]) != "[]" || raw["header"] == nil || raw["header_view"] == nil ||
		raw["commands"] == nil || raw["proofs"] == nil {
		t.Fatalf("batch file %s", batch)
	}
	var bf adminapi.BatchFile
	if err := json.Unmarshal([]byte(batch), &bf); err != nil {
		t.Fatal(err)
	}
	if h, err := quorum.DecodeHeader(bf.Header); err != nil || h.BatchID != "lab-wipe-1" || h.Count != 2 ||
		time.Until(time.UnixMilli(h.NotAfterUnixMS)) < 119*time.Minute || bf.HeaderView.BatchID != "lab-wipe-1" {
		t.Fatalf("header %s %v", bf.Header, err)
	}
	if bf.Commands[0].ID != wipe.ID || bf.Commands[1].ID != reboot.ID || len(bf.Commands[1].Signature) == 0 {
		t.Fatalf("batch commands %+v", bf.Commands)
	}
	batchFile := writeWork(t, work, "batch.json", batch)

	// approve: no data directory; it says what it approves.
	code, once, errOut := runCLI(t, ctx, "", "batch", "approve", "--key", A.key, "--in", batchFile)
	pinA, _ := pki.Pin(mustParse(t, A.spki))
	if code != 0 || !strings.Contains(errOut, "batch lab-wipe-1: 2 commands, expires") || !strings.Contains(errOut, "disk.wipe") ||
		!strings.Contains(errOut, "node.reboot") || !strings.Contains(errOut, "node_a") || !strings.Contains(errOut, `{"devices":["/dev/sdb"]}`) ||
		!strings.Contains(errOut, "approved batch lab-wipe-1 (2 commands), with the key "+pinA+"; it carries 1 approvals") {
		t.Fatalf("approve: exit %d %q", code, errOut)
	}
	noKeyIn(t, "approve", once+errOut, A.pem)
	code, twice, errOut := runCLI(t, ctx, once, "batch", "approve", "--key", B.key)
	if code != 0 || !strings.Contains(errOut, "it carries 2 approvals") {
		t.Fatalf("second approve: exit %d %q", code, errOut)
	}
	noKeyIn(t, "approve", twice+errOut, B.pem)
	approvedFile := writeWork(t, work, "approved.json", twice)

	code, out, errOut := run("", "batch", "submit", "--in", approvedFile)
	var views []adminapi.CommandView
	if code != 0 || errOut != "" || json.Unmarshal([]byte(out), &views) != nil || len(views) != 2 {
		t.Fatalf("batch submit: exit %d %q %q", code, out, errOut)
	}
	doc := heldBundle(t, s, dir)
	qs, err := doc.Approvers.Set()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []adminapi.PreparedCommand{wipe, reboot} {
		if views[i].ID != want.ID || !views[i].Signed || views[i].Batch == nil || views[i].Batch.ID != "lab-wipe-1" || views[i].Batch.Index != uint32(i) {
			t.Errorf("view %d: %+v", i, views[i])
		}
		c, err := s.Store().Command(want.ID)
		if err != nil || c.Batch == nil {
			t.Fatalf("stored %d: %+v %v", i, c, err)
		}
		f := frameOf(c)
		if err := doc.Roots().VerifyCommand(f); err != nil {
			t.Errorf("command %d: signature: %v", i, err)
		}
		if vf, err := quorum.Verify(f, qs, time.Now()); err != nil || vf.Index != i || vf.BatchID != "lab-wipe-1" {
			t.Errorf("command %d: leaf %+v %v", i, vf, err)
		}
	}
	if c, _ := s.Store().Command(reboot.ID); !bytes.Equal(c.Signature, bf.Commands[1].Signature) {
		t.Error("the signed command lost its signature")
	}
	// Submitted again: refused.
	if code, _, errOut := run("", "batch", "submit", "--in", approvedFile); code != cli.ExitFailure || !strings.Contains(errOut, "exists already") {
		t.Errorf("a second submit: exit %d %q", code, errOut)
	}

	// A destructive command outside a batch: sent, with a warning.
	if code, _, errOut := run("", "run", "node_a", "node.reboot"); code != 0 || !strings.Contains(errOut, "bcgw run: warning: trust bundle version") ||
		!strings.Contains(errOut, "without an approved batch leaf (BATCH_UNAPPROVED)") {
		t.Errorf("an unbatched node.reboot: exit %d %q", code, errOut)
	}

	// --commands-from, approved once: submitted with a warning, then
	// --wait reports the agent's refusal and exits 1.
	cmdDir := t.TempDir()
	_, w2 := prepare("w2.json", "node_a", "disk.wipe")
	_, p2 := prepare("p2.json", "node_a", "agent.ping")
	for name, pc := range map[string]adminapi.PreparedCommand{"2-ping.json": p2, "1-wipe.json": w2} {
		b, _ := json.Marshal(pc)
		writeWork(t, cmdDir, name, string(b))
	}
	writeWork(t, cmdDir, "notes.txt", "not a command")
	code, batch2, errOut := runCLI(t, ctx, "", "batch", "create", "--id", "lab-2", "--commands-from", cmdDir)
	if code != 0 || !strings.Contains(errOut, "agent.ping (not destructive)") {
		t.Fatalf("create --commands-from: exit %d %q", code, errOut)
	}
	var bf2 adminapi.BatchFile
	_ = json.Unmarshal([]byte(batch2), &bf2)
	if len(bf2.Commands) != 2 || bf2.Commands[0].ID != w2.ID || bf2.Commands[1].ID != p2.ID {
		t.Fatalf("--commands-from order: %+v", bf2.Commands)
	}
	_, approved2, _ := runCLI(t, ctx, batch2, "batch", "approve", "--key", C.key)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if _, err := s.Store().Command(p2.ID); err == nil {
				s.Store().SetResult("node_a", w2.ID, store.Result{Status: "BATCH_UNAPPROVED", Error: "BATCH_UNAPPROVED: batch lab-2 has 1 valid approvals"})
				s.Store().SetResult("node_a", p2.ID, store.Result{Status: "SUCCEEDED", Output: []byte(`{}`)})
				return
			}
		}
	}()
	code, out, errOut = run(approved2, "batch", "submit", "--wait", "--timeout", "10s")
	<-done
	views = nil
	if code != cli.ExitFailure || json.Unmarshal([]byte(out), &views) != nil || len(views) != 2 || views[0].Status != "BATCH_UNAPPROVED" || views[1].Status != "SUCCEEDED" ||
		!strings.Contains(errOut, "warning: "+w2.ID+" (disk.wipe for node_a): agents that hold trust bundle version") ||
		!strings.Contains(errOut, "1 of 2 commands did not succeed") || !strings.Contains(errOut, w2.ID+": BATCH_UNAPPROVED") {
		t.Fatalf("submit --wait: exit %d %q %q", code, out, errOut)
	}

	// Batch file errors.
	tampered := func(edit func(bf *adminapi.BatchFile)) string {
		var b adminapi.BatchFile
		_ = json.Unmarshal([]byte(once), &b)
		edit(&b)
		out, _ := json.Marshal(b)
		return string(out)
	}
	var m map[string]any
	_ = json.Unmarshal([]byte(once), &m)
	m["extra"] = 1
	extra, _ := json.Marshal(m)
	specFile := writeWork(t, work, "spec.json", `{"node":"node_a","generation":1,"patch":false,"base_generation":0,"spec":{}}`)
	loose := filepath.Join(t.TempDir(), "loose.pem")
	_ = os.WriteFile(loose, A.pem, 0o644)
	expired := func() string {
		_, pc := prepare("e.json", "node_a", "disk.wipe")
		bf, err := adminapi.BuildBatch("gone", []adminapi.PreparedCommand{pc}, time.Now().Add(5*time.Millisecond), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(bf)
		time.Sleep(10 * time.Millisecond)
		return string(b)
	}()
	for _, tt := range []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{tampered(func(b *adminapi.BatchFile) { b.Commands[0].Body = json.RawMessage(`{"devices":["/dev/sda"]}`) }),
			[]string{"batch", "approve", "--key", B.key}, cli.ExitFailure, "is not leaf 0 of batch lab-wipe-1: its kind, node or body differ"},
		{tampered(func(b *adminapi.BatchFile) { b.Commands = b.Commands[:1] }), []string{"batch", "approve", "--key", B.key}, cli.ExitFailure, "the header counts 2 commands; the file has 1"},
		{tampered(func(b *adminapi.BatchFile) { b.HeaderView.Count = 3 }), []string{"batch", "approve", "--key", B.key}, cli.ExitFailure, "header_view does not say what header says"},
		{tampered(func(b *adminapi.BatchFile) { b.Approvals = [][]byte{{1}} }), []string{"batch", "submit", "--data-dir", dir}, cli.ExitFailure, "approval 0 is 1 bytes"},
		{string(extra), []string{"batch", "approve", "--key", B.key}, cli.ExitFailure, `not a batch file (bcgw batch create makes one): json: unknown field "extra"`},
		{"{", []string{"batch", "submit", "--data-dir", dir}, cli.ExitFailure, "not a batch file"},
		{"", []string{"batch", "submit", "--data-dir", dir}, cli.ExitFailure, "stdin is empty"},
		{signedReboot, []string{"batch", "approve", "--key", B.key}, cli.ExitFailure, "not a batch file"},
		{expired, []string{"batch", "approve", "--key", B.key}, cli.ExitFailure, "batch gone expired at"},
		{expired, []string{"batch", "submit", "--data-dir", dir}, cli.ExitFailure, "batch gone expired at"},
		{once, []string{"batch", "approve", "--key", loose}, cli.ExitFailure, "chmod 600"},
		{once, []string{"batch", "approve"}, cli.ExitUsage, "--key is required"},
		{"", []string{"batch", "create", "--command", wipeFile}, cli.ExitUsage, "--id is required"},
		{"", []string{"batch", "create", "--id", "x"}, cli.ExitUsage, "--command FILE (repeated) or --commands-from DIR"},
		{"", []string{"batch", "create", "--id", "x", "--command", wipeFile, "--commands-from", cmdDir}, cli.ExitUsage, "one of the two"},
		{"", []string{"batch", "create", "--id", "x", "--command", specFile}, cli.ExitFailure, "a prepared spec; a batch holds commands"},
		{"", []string{"batch", "create", "--id", "x", "--command", wipeFile, "--command", wipeFile}, cli.ExitFailure, "command 1 is command 0"},
		{"", []string{"batch", "create", "--id", "x/y", "--command", wipeFile}, cli.ExitFailure, `batch id "x/y"`},
		{"", []string{"batch", "create", "--id", "x", "--command", approvedFile}, cli.ExitFailure, "not a prepared command"},
		{"", []string{"batch", "create", "--id", "x", "--commands-from", t.TempDir()}, cli.ExitFailure, "holds no *.json file"},
		{"", []string{"batch", "frob"}, cli.ExitUsage, "usage: bcgw batch create"},
		{"", []string{"batch"}, cli.ExitUsage, "usage: bcgw batch create"},
	} {
		code, out, errOut := runCLI(t, ctx, tt.stdin, tt.args...)
		if code != tt.code || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d %q, want %d and %q", tt.args, code, errOut, tt.code, tt.want)
		}
		for _, ap := range []approver{A, B} {
			noKeyIn(t, strings.Join(tt.args, " "), out+errOut, ap.pem)
		}
	}
}
