package gateway_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/quorum"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

func newKeys(t *testing.T, n int) []crypto.Signer {
	t.Helper()
	ks := make([]crypto.Signer, n)
	for i := range ks {
		k, err := pki.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		ks[i] = k
	}
	return ks
}

func spkisOf(t *testing.T, ks ...crypto.Signer) [][]byte {
	t.Helper()
	out := make([][]byte, len(ks))
	for i, k := range ks {
		out[i] = spkiOf(t, k)
	}
	return out
}

// endorse runs an approver set file through EndorseApprovers with each
// key, as it travels between the approvers' machines.
func endorse(t *testing.T, set adminapi.ApproverSet, ks ...crypto.Signer) adminapi.ApproverSet {
	t.Helper()
	for _, k := range ks {
		var err error
		if set, _, err = adminapi.EndorseApprovers(k, reindent(t, set)); err != nil {
			t.Fatal(err)
		}
	}
	return set
}

// TestApproverSet: a proposed set, endorsed and set, is in the next
// Welcome's bundle; the first set needs no endorsement; a change without
// the held threshold of endorsements is stored with a warning, and an
// agent holding the earlier set keeps it (bundle.Held) until enough
// endorsements come; setting the very set again changes nothing.
func TestApproverSet(t *testing.T) {
	dir := t.TempDir()
	g := startGateway(t, gateway.Config{DataDir: dir})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ac := adminapi.NewClient(dir, "", "")
	a := g.join(t)
	_, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	// An agent's held bundle, fed every bundle the gateway makes.
	held, err := bundle.Load(t.TempDir(), g.pins.JoinSigning)
	if err != nil {
		t.Fatal(err)
	}
	offer := func() {
		t.Helper()
		if _, err := held.Offer(g.s.TrustBundle()); err != nil {
			t.Fatalf("the agent refuses the bundle: %v", err)
		}
	}
	offer()

	A, B, C, D, E := func(k []crypto.Signer) (crypto.Signer, crypto.Signer, crypto.Signer, crypto.Signer, crypto.Signer) {
		return k[0], k[1], k[2], k[3], k[4]
	}(newKeys(t, 5))
	v, _ := ac.Trust(ctx)
	if v.Approvers != nil {
		t.Fatalf("a fresh bundle has approvers %+v", v.Approvers)
	}
	first, err := adminapi.ProposeApprovers(0, 0, 2, spkisOf(t, A, B, C))
	if err != nil || first.Epoch != 1 || first.Threshold != 2 || len(first.Keys) != 3 || first.Endorsements == nil {
		t.Fatalf("propose: %+v %v", first, err)
	}
	back, err := adminapi.DecodeApproverSet(reindent(t, first))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := ac.SetApprovers(ctx, back)
	if err != nil || !ch.Changed || ch.Version != 2 || ch.Warning != "" || ch.Epoch != 1 || ch.Threshold != 2 || ch.Keys != 3 {
		t.Fatalf("set the first approvers: %+v %v", ch, err)
	}
	recvDrain(t, st)
	waitFor(t, "the drained session to end", func() bool { return !g.s.Connected(a.NodeID) })
	w, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	doc := bundleOf(t, g, w)
	if doc.Version != 2 || doc.Approvers == nil || doc.Approvers.Epoch != 1 || doc.Approvers.Threshold != 2 ||
		!equalBytes(doc.Approvers.Keys, spkisOf(t, A, B, C)) || len(doc.Approvers.Endorsements) != 0 || len(doc.CommandSigningRoots) != 1 {
		t.Fatalf("bundle after approvers set: %+v", doc)
	}
	if _, err := bundle.Decode(w.GetTrustBundle().GetDocument()); err != nil {
		t.Fatal(err)
	}
	offer()
	if h := held.Approvers(); h == nil || h.Epoch != 1 {
		t.Fatalf("the agent holds %+v, want epoch 1", h)
	}
	v, _ = ac.Trust(ctx)
	if p, _ := pki.Pin(A.Public()); v.Approvers == nil || v.Approvers.Epoch != 1 || v.Approvers.Threshold != 2 || len(v.Approvers.Keys) != 3 || v.Approvers.Keys[0] != p {
		t.Errorf("trust view approvers %+v", v.Approvers)
	}

	// The very set again: no new version, no drain.
	if ch, err := g.s.SetApprovers(first); err != nil || ch.Changed || ch.Version != 2 {
		t.Errorf("the same set again: %+v %v", ch, err)
	}
	noFrameBefore(t, st, "unchanged-approvers")

	// Epoch 2, endorsed by one of the held threshold of two: stored, with a
	// warning; the agent keeps epoch 1.
	next, err := adminapi.ProposeApprovers(1, 0, 1, spkisOf(t, D, E))
	if err != nil || next.Epoch != 2 {
		t.Fatalf("propose epoch 2: %+v %v", next, err)
	}
	once := endorse(t, next, A)
	ch, err = ac.SetApprovers(ctx, once)
	if err != nil || !ch.Changed || ch.Version != 3 || !strings.Contains(ch.Warning, "endorsed by 1 of the held set's keys; it needs 2") ||
		!strings.Contains(ch.Warning, "epoch 1 keep it") {
		t.Fatalf("an under-endorsed set: %+v %v", ch, err)
	}
	recvDrain(t, st)
	offer()
	if h := held.Approvers(); h.Epoch != 1 || !strings.Contains(held.ApproversRefused(), "needs 2") {
		t.Errorf("the agent holds epoch %d (%q), want epoch 1 kept", h.Epoch, held.ApproversRefused())
	}
	// A second endorsement by A changes nothing of the count.
	if again := endorse(t, once, A); len(again.Endorsements) != 1 {
		t.Errorf("endorsing twice with one key: %d endorsements", len(again.Endorsements))
	}
	// B endorses too: the same set with more endorsements is a new version
	// without a warning (the held set is epoch 2 now), and the agent that
	// kept epoch 1 takes it.
	twice := endorse(t, once, B)
	ch, err = g.s.SetApprovers(twice)
	if err != nil || !ch.Changed || ch.Version != 4 || ch.Warning != "" || ch.Endorsements != 2 {
		t.Fatalf("the endorsed set: %+v %v", ch, err)
	}
	offer()
	if h := held.Approvers(); h.Epoch != 2 || !equalBytes(h.Keys, spkisOf(t, D, E)) {
		t.Errorf("the agent holds %+v, want epoch 2", h)
	}
	// A set at an epoch not above the held one: stored, with a warning.
	ch, err = g.s.SetApprovers(endorse(t, adminapi.ApproverSet{Epoch: 2, Threshold: 1, Keys: spkisOf(t, A)}, D))
	if err != nil || !strings.Contains(ch.Warning, "is not above the held epoch 2") {
		t.Errorf("a set at the held epoch: %+v %v", ch, err)
	}

	// Refusals: propose at the held epoch, a threshold above the keys, a
	// key twice, a key of another curve, a non-canonical key, a malformed
	// endorsement, an unknown field.
	if _, err := adminapi.ProposeApprovers(2, 2, 1, spkisOf(t, A)); err == nil || !strings.Contains(err.Error(), "not above") {
		t.Errorf("propose at the held epoch: %v", err)
	}
	for name, set := range map[string]adminapi.ApproverSet{
		"threshold above the keys": {Epoch: 3, Threshold: 2, Keys: spkisOf(t, A)},
		"threshold 0":              {Epoch: 3, Threshold: 0, Keys: spkisOf(t, A)},
		"a key twice":              {Epoch: 3, Threshold: 1, Keys: spkisOf(t, A, A)},
		"no keys":                  {Epoch: 3, Threshold: 1},
		"no epoch":                 {Threshold: 1, Keys: spkisOf(t, A)},
		"garbage key":              {Epoch: 3, Threshold: 1, Keys: [][]byte{[]byte("x")}},
		"short endorsement":        {Epoch: 3, Threshold: 1, Keys: spkisOf(t, A), Endorsements: [][]byte{[]byte("x")}},
	} {
		if _, err := adminapi.DecodeApproverSet(reindent(t, set)); err == nil {
			t.Errorf("%s: decoded", name)
		}
		if _, err := g.s.SetApprovers(set); err == nil {
			t.Errorf("%s: set", name)
		}
	}
	if _, err := adminapi.DecodeApproverSet([]byte(`{"epoch":3,"threshold":1,"keys":[],"endorsements":[],"extra":1}`)); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("an unknown field: %v", err)
	}
	if v, _ := g.s.Trust(); v.Version != 5 {
		t.Errorf("version %d after refusals, want 5", v.Version)
	}

	// A restart keeps the set.
	_ = st.CloseRequest()
	if err := g.stop(true); err != nil {
		t.Fatal(err)
	}
	g2 := startGateway(t, gateway.Config{DataDir: dir})
	if v, _ := g2.s.Trust(); v.Version != 5 || v.Approvers == nil || v.Approvers.Epoch != 2 || len(v.Approvers.Keys) != 1 {
		t.Errorf("after a restart: %+v", v)
	}
}

func equalBytes(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// approve runs a batch file through ApproveBatch with each key.
func approve(t *testing.T, bf adminapi.BatchFile, ks ...crypto.Signer) adminapi.BatchFile {
	t.Helper()
	for _, k := range ks {
		var err error
		if bf, err = adminapi.ApproveBatch(k, reindent(t, bf), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	return bf
}

// TestBatchRoundTrip: prepared commands (unsigned, and signed by another
// root) made a batch, approved by two of three approvers and submitted
// reach the agent each with its leaf, which verifies (quorum.Verify) under
// the approver set of the Welcome's bundle, and with a signature that
// verifies under its roots; a re-send after a redial carries the same
// leaf. An under-approved batch is sent with a warning; a malformed,
// tampered, expired or resubmitted one is refused.
func TestBatchRoundTrip(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ac := adminapi.NewClient(g.dir, "", "")
	ks := newKeys(t, 4)
	A, B, C, stranger := ks[0], ks[1], ks[2], ks[3]
	ext, _ := pki.GenerateKey()
	if _, err := g.s.AddTrustRoot(spkiOf(t, ext)); err != nil {
		t.Fatal(err)
	}
	a := g.join(t)

	// Before the bundle names approvers, a batch goes out with a warning
	// that agents do not check it.
	p0, _ := g.s.PrepareCommand(a.NodeID, "agent.ping", nil, time.Hour)
	bf, err := adminapi.BuildBatch("early", []adminapi.PreparedCommand{p0}, time.Now().Add(time.Hour), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ac.SubmitBatch(ctx, bf); err != nil || !strings.Contains(v.Warning, "names no approver set") || len(v.Commands) != 1 || !v.Commands[0].Signed {
		t.Fatalf("a batch without approvers: %+v %v", v, err)
	}

	set, _ := adminapi.ProposeApprovers(0, 0, 2, spkisOf(t, A, B, C))
	if _, err := g.s.SetApprovers(set); err != nil {
		t.Fatal(err)
	}
	w, st := g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	doc := bundleOf(t, g, w)
	roots := doc.Roots()
	qs, err := doc.Approvers.Set()
	if err != nil {
		t.Fatal(err)
	}
	if c := recv(t, st).GetCommand(); c.GetId() != p0.ID { // the early one, pending
		t.Fatalf("frame %v, want the early command", c)
	}

	wipe, err := g.s.PrepareCommand(a.NodeID, "disk.wipe", []byte(`{ "devices": ["/dev/sdb"], "note": "<&>" }`), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	reboot, _ := g.s.PrepareCommand(a.NodeID, "node.reboot", nil, time.Hour)
	signed, _, err := adminapi.SignPrepared(ext, reindent(t, reboot))
	if err != nil {
		t.Fatal(err)
	}
	reboot = *signed.(*adminapi.PreparedCommand)
	ping, _ := g.s.PrepareCommand(a.NodeID, "agent.ping", nil, time.Hour)
	cmds := []adminapi.PreparedCommand{wipe, reboot, ping}
	bf, err = adminapi.BuildBatch("wipe-2026-11-29", cmds, time.Now().Add(time.Hour), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if bf.HeaderView.Count != 3 || bf.HeaderView.BatchID != "wipe-2026-11-29" || len(bf.Proofs) != 3 || bf.Approvals == nil {
		t.Fatalf("batch %+v", bf)
	}
	if h, err := quorum.DecodeHeader(bf.Header); err != nil || h.Count != 3 || !bytes.Equal(h.Root, bf.HeaderView.Root) {
		t.Fatalf("header %s: %v", bf.Header, err)
	}
	if d := bf.Describe(time.Now()); !strings.Contains(d, "batch wipe-2026-11-29: 3 commands") || !strings.Contains(d, "disk.wipe") ||
		!strings.Contains(d, a.NodeID) || !strings.Contains(d, "agent.ping (not destructive)") {
		t.Errorf("Describe:\n%s", d)
	}
	approved := approve(t, bf, A, B)
	if len(approved.Approvals) != 2 {
		t.Fatalf("%d approvals", len(approved.Approvals))
	}
	if again := approve(t, approved, A); len(again.Approvals) != 2 {
		t.Errorf("approving twice with one key: %d approvals", len(again.Approvals))
	}
	file, err := adminapi.DecodeBatch(reindent(t, approved))
	if err != nil {
		t.Fatal(err)
	}
	v, err := ac.SubmitBatch(ctx, file)
	if err != nil || v.BatchID != "wipe-2026-11-29" || v.Warning != "" || len(v.Commands) != 3 {
		t.Fatalf("submit: %+v %v", v, err)
	}
	for i, cv := range v.Commands {
		if cv.ID != cmds[i].ID || !cv.Signed || cv.Warning != "" || cv.Batch == nil || cv.Batch.ID != "wipe-2026-11-29" || cv.Batch.Index != uint32(i) {
			t.Errorf("view %d: %+v", i, cv)
		}
	}
	got := make([]*bcdv1.Command, 3)
	for i := range got {
		c := recv(t, st).GetCommand()
		if c.GetId() != cmds[i].ID {
			t.Fatalf("command %d: frame %v, want %s", i, c, cmds[i].ID)
		}
		if err := roots.VerifyCommand(c); err != nil {
			t.Errorf("command %d: signature: %v", i, err)
		}
		vf, err := quorum.Verify(c, qs, time.Now())
		if err != nil || vf.BatchID != "wipe-2026-11-29" || vf.Index != i {
			t.Errorf("command %d: leaf %+v: %v", i, vf, err)
		}
		got[i] = c
	}
	if !bytes.Equal(got[1].GetSignature(), reboot.Signature) {
		t.Error("the signed command does not keep its signature")
	}
	if id, _, _ := intent.ParseSignature(got[0].GetSignature()); id != mustKeyID(t, g.s.OwnCommandKey()) {
		t.Error("the unsigned command is not signed with bcgw's own key")
	}
	if string(got[0].GetBody()) != `{"devices":["/dev/sdb"],"note":"<&>"}` {
		t.Errorf("body %s", got[0].GetBody())
	}
	// The leaf is worth nothing for another node, kind or body.
	for name, f := range map[string]func(c *bcdv1.Command){
		"another node": func(c *bcdv1.Command) { c.NodeId = "node_other" },
		"another kind": func(c *bcdv1.Command) { c.Kind = "deploy.image" },
		"another body": func(c *bcdv1.Command) { c.Body = []byte(`{"devices":["/dev/sda"]}`) },
		"another leaf": func(c *bcdv1.Command) { c.Batch.Index = 1 },
	} {
		c := proto.Clone(got[0]).(*bcdv1.Command)
		f(c)
		if _, err := quorum.Verify(c, qs, time.Now()); err == nil {
			t.Errorf("%s: the leaf verifies", name)
		}
	}
	// After a redial the commands come again with the same leaves.
	_ = st.CloseRequest()
	waitFor(t, "the session to end", func() bool { return !g.s.Connected(a.NodeID) })
	_, st = g.welcomeOf(t, ctx, a, &bcdv1.Hello{})
	recv(t, st) // the early command
	for i := range got {
		c := recv(t, st).GetCommand()
		if !proto.Equal(c, got[i]) {
			t.Errorf("re-sent command %d differs:\n%v\n%v", i, c, got[i])
		}
	}

	// A destructive command outside a batch is sent, with a warning; one
	// that is not destructive has none.
	if v, err := ac.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "gpu.reset"}); err != nil || !strings.Contains(v.Warning, "without an approved batch leaf") {
		t.Errorf("an unbatched gpu.reset: %+v %v", v, err)
	}
	if v, err := ac.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "agent.ping"}); err != nil || v.Warning != "" {
		t.Errorf("agent.ping: %+v %v", v, err)
	}
	un, _ := g.s.PrepareCommand(a.NodeID, "bmc.power", nil, time.Hour)
	if v, err := ac.SubmitCommand(ctx, adminapi.SubmitCommandRequest{Command: un}); err != nil || !strings.Contains(v.Warning, "UNSIGNED") ||
		!strings.Contains(v.Warning, "without an approved batch leaf") {
		t.Errorf("an unbatched, unsigned bmc.power: %+v %v", v, err)
	}
	for range 3 {
		recv(t, st)
	}

	// Submitted again: refused, nothing sent.
	if _, err := ac.SubmitBatch(ctx, file); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("a second submit: %v", err)
	}
	// Approved by one approver and a stranger: sent, with a warning for
	// the destructive kinds only.
	w2, _ := g.s.PrepareCommand(a.NodeID, "disk.wipe", []byte(`{}`), time.Hour)
	p2, _ := g.s.PrepareCommand(a.NodeID, "agent.ping", nil, time.Hour)
	bf2, _ := adminapi.BuildBatch("under", []adminapi.PreparedCommand{w2, p2}, time.Now().Add(time.Hour), time.Now())
	v, err = ac.SubmitBatch(ctx, approve(t, bf2, A, stranger))
	if err != nil || len(v.Commands) != 2 || !strings.Contains(v.Commands[0].Warning, "BATCH_UNAPPROVED") ||
		!strings.Contains(v.Commands[0].Warning, "has 1 valid approvals") || v.Commands[1].Warning != "" {
		t.Fatalf("an under-approved batch: %+v %v", v, err)
	}
	for range 2 {
		if _, err := quorum.Verify(recv(t, st).GetCommand(), qs, time.Now()); err != nil && !strings.Contains(err.Error(), "needs 2") {
			t.Errorf("under-approved leaf: %v", err)
		}
	}

	// Malformed and tampered files.
	fresh := func() adminapi.BatchFile {
		c1, _ := g.s.PrepareCommand(a.NodeID, "disk.wipe", []byte(`{"devices":["/dev/sdb"]}`), time.Hour)
		c2, _ := g.s.PrepareCommand(a.NodeID, "node.reboot", nil, time.Hour)
		bf, err := adminapi.BuildBatch("t", []adminapi.PreparedCommand{c1, c2}, time.Now().Add(time.Hour), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return approve(t, bf, A, B)
	}
	for _, tt := range []struct {
		name string
		edit func(bf *adminapi.BatchFile)
		want string
	}{
		{"a body edited", func(bf *adminapi.BatchFile) { bf.Commands[0].Body = json.RawMessage(`{"devices":["/dev/sda"]}`) }, "is not leaf 0 of batch t"},
		{"a node edited", func(bf *adminapi.BatchFile) { bf.Commands[1].NodeID = "node_other" }, "is not leaf 1 of batch t"},
		{"commands swapped", func(bf *adminapi.BatchFile) { bf.Commands[0], bf.Commands[1] = bf.Commands[1], bf.Commands[0] }, "is not leaf 0"},
		{"a proof edited", func(bf *adminapi.BatchFile) { bf.Proofs[0][0] = bytes.Repeat([]byte{1}, 32) }, "is not leaf 0"},
		{"a command dropped", func(bf *adminapi.BatchFile) { bf.Commands = bf.Commands[:1] }, "the header counts 2 commands; the file has 1"},
		{"a proof dropped", func(bf *adminapi.BatchFile) { bf.Proofs = bf.Proofs[:1] }, "the file has 1 proofs"},
		{"header_view edited", func(bf *adminapi.BatchFile) { bf.HeaderView.NotAfter = bf.HeaderView.NotAfter.Add(time.Hour) }, "header_view does not say"},
		{"header edited", func(bf *adminapi.BatchFile) { bf.Header = []byte(`{"v":1}`) }, "batch header"},
		{"a short approval", func(bf *adminapi.BatchFile) { bf.Approvals[0] = []byte("x") }, "approval 0 is 1 bytes"},
		{"a command twice", func(bf *adminapi.BatchFile) { bf.Commands[1] = bf.Commands[0] }, "again"},
		{"a bad command", func(bf *adminapi.BatchFile) { bf.Commands[0].ID = "cmd_x" }, "command 0: id"},
	} {
		bf := fresh()
		tt.edit(&bf)
		if _, err := adminapi.DecodeBatch(reindent(t, bf)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: DecodeBatch: %v, want %q", tt.name, err, tt.want)
		}
		if _, err := adminapi.ApproveBatch(C, reindent(t, bf), time.Now()); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: ApproveBatch: %v, want %q", tt.name, err, tt.want)
		}
		if _, err := ac.SubmitBatch(ctx, bf); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: submit: %v, want %q", tt.name, err, tt.want)
		}
	}
	for name, b := range map[string]string{"not JSON": "{", "unknown field": `{"header":"","extra":1}`, "a prepared command": string(reindent(t, p0))} {
		if _, err := adminapi.DecodeBatch([]byte(b)); err == nil || !strings.Contains(err.Error(), "not a batch file") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Expired: approve and submit refuse it.
	old := fresh()
	if _, err := adminapi.ApproveBatch(C, reindent(t, old), time.Now().Add(2*time.Hour)); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("approving an expired batch: %v", err)
	}
	c3, _ := g.s.PrepareCommand(a.NodeID, "disk.wipe", nil, time.Hour)
	short, err := adminapi.BuildBatch("short", []adminapi.PreparedCommand{c3}, time.Now().Add(5*time.Millisecond), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if _, err := ac.SubmitBatch(ctx, short); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("submitting an expired batch: %v", err)
	}
	// An unknown node refuses the whole batch, before anything is stored.
	good, _ := g.s.PrepareCommand(a.NodeID, "disk.wipe", nil, time.Hour)
	nobody := good
	nobody.ID, nobody.NodeID = "cmd_aaaaaaaaaaaaaaaaaaaaa", "node_nobody"
	bf3, _ := adminapi.BuildBatch("nobody", []adminapi.PreparedCommand{good, nobody}, time.Now().Add(time.Hour), time.Now())
	if _, err := ac.SubmitBatch(ctx, bf3); err == nil || !strings.Contains(err.Error(), "node_nobody") {
		t.Errorf("a batch for an unknown node: %v", err)
	}
	if _, err := g.s.Store().Command(good.ID); err == nil {
		t.Error("a refused batch stored a command")
	}
	// Build refusals.
	for name, f := range map[string]func() error{
		"no id": func() error {
			_, err := adminapi.BuildBatch("", []adminapi.PreparedCommand{good}, time.Now().Add(time.Hour), time.Now())
			return err
		},
		"bad id": func() error {
			_, err := adminapi.BuildBatch("a/b", []adminapi.PreparedCommand{good}, time.Now().Add(time.Hour), time.Now())
			return err
		},
		"none": func() error {
			_, err := adminapi.BuildBatch("x", nil, time.Now().Add(time.Hour), time.Now())
			return err
		},
		"past": func() error {
			_, err := adminapi.BuildBatch("x", []adminapi.PreparedCommand{good}, time.Now(), time.Now())
			return err
		},
		"twice": func() error {
			_, err := adminapi.BuildBatch("x", []adminapi.PreparedCommand{good, good}, time.Now().Add(time.Hour), time.Now())
			return err
		},
		"a deadline": func() error {
			_, err := adminapi.BuildBatch("x", []adminapi.PreparedCommand{good}, time.Now().Add(3*time.Hour), time.Now().Add(2*time.Hour))
			return err
		},
	} {
		if err := f(); err == nil {
			t.Errorf("%s: built", name)
		}
	}
}

func mustKeyID(t *testing.T, spki []byte) [32]byte {
	t.Helper()
	if len(spki) == 0 {
		t.Fatal("no own key")
	}
	return sha256.Sum256(spki)
}
