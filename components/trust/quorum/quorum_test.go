package quorum

import (
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"google.golang.org/protobuf/proto"
)

func keys(t testing.TB, n int) ([]*ecdsa.PrivateKey, [][]byte) {
	var ks []*ecdsa.PrivateKey
	var ders [][]byte
	for range n {
		k, _ := pki.GenerateKey()
		der, _ := x509.MarshalPKIXPublicKey(k.Public())
		ks, ders = append(ks, k), append(ders, der)
	}
	return ks, ders
}

func set(t testing.TB, ders [][]byte, threshold int, epoch uint64) Set {
	r, err := intent.ParseRoots(ders)
	if err != nil {
		t.Fatal(err)
	}
	return Set{Epoch: epoch, Threshold: threshold, Keys: r}
}

// batch builds a batch of the commands and attaches each one's leaf with
// the approvals of signers.
func batch(t testing.TB, cmds []*bcdv1.Command, notAfter time.Time, signers ...*ecdsa.PrivateKey) []byte {
	t.Helper()
	var leaves []Leaf
	for _, c := range cmds {
		leaves = append(leaves, LeafOf(c))
	}
	h, proofs, err := Build("b1", leaves, notAfter)
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := HeaderJSON(h)
	var approvals [][]byte
	for _, k := range signers {
		a, err := Approve(k, hb)
		if err != nil {
			t.Fatal(err)
		}
		approvals = append(approvals, a)
	}
	for i, c := range cmds {
		c.Batch = &bcdv1.BatchLeaf{Header: hb, Approvals: approvals, Index: uint32(i), Proof: proofs[i]}
	}
	return hb
}

func wipe(node, dev string) *bcdv1.Command {
	return &bcdv1.Command{Id: "c-" + node + dev, NodeId: node, Kind: "disk.wipe", Body: []byte(`{"devices":["` + dev + `"]}`)}
}

func TestEveryLeafOfEveryBatchSizeVerifies(t *testing.T) {
	ks, ders := keys(t, 3)
	s := set(t, ders, 2, 1)
	now := time.Now()
	for _, n := range []int{1, 2, 3, 5, 8, 13} {
		var cmds []*bcdv1.Command
		for i := range n {
			cmds = append(cmds, wipe(fmt.Sprintf("n%d", i), "/dev/vdb"))
		}
		batch(t, cmds, now.Add(time.Hour), ks[0], ks[2])
		for i, c := range cmds {
			if _, err := Verify(c, s, now); err != nil {
				t.Errorf("batch of %d, leaf %d: %v", n, i, err)
			}
		}
	}
}

func TestVerifyRefuses(t *testing.T) {
	ks, ders := keys(t, 3)
	outsider, _ := keys(t, 1)
	s := set(t, ders, 2, 1)
	now := time.Now()
	mk := func() []*bcdv1.Command {
		return []*bcdv1.Command{wipe("n1", "/dev/vdb"), wipe("n2", "/dev/vdb"), wipe("n3", "/dev/vdc")}
	}
	two := mk()
	batch(t, two, now.Add(time.Hour), ks[0], ks[1])
	for name, tc := range map[string]struct {
		c    *bcdv1.Command
		want string
	}{
		"no batch":       {wipe("n1", "/dev/vdb"), "carries no approved batch leaf"},
		"one approval":   {func() *bcdv1.Command { c := mk(); batch(t, c, now.Add(time.Hour), ks[0]); return c[0] }(), "1 valid approvals"},
		"twice the same": {func() *bcdv1.Command { c := mk(); batch(t, c, now.Add(time.Hour), ks[0], ks[0]); return c[0] }(), "1 valid approvals"},
		"an outsider":    {func() *bcdv1.Command { c := mk(); batch(t, c, now.Add(time.Hour), ks[0], outsider[0]); return c[0] }(), "1 valid approvals"},
		"expired":        {func() *bcdv1.Command { c := mk(); batch(t, c, now.Add(-time.Second), ks[0], ks[1]); return c[0] }(), "expired"},
		"another body": {func() *bcdv1.Command {
			c := proto.Clone(two[0]).(*bcdv1.Command)
			c.Body = []byte(`{"devices":["/dev/vda"]}`)
			return c
		}(), "not leaf 0"},
		"another node":  {func() *bcdv1.Command { c := proto.Clone(two[0]).(*bcdv1.Command); c.NodeId = "n9"; return c }(), "not leaf 0"},
		"another index": {func() *bcdv1.Command { c := proto.Clone(two[0]).(*bcdv1.Command); c.Batch.Index = 1; return c }(), "not leaf 1"},
		"out of range":  {func() *bcdv1.Command { c := proto.Clone(two[0]).(*bcdv1.Command); c.Batch.Index = 7; return c }(), "leaf 7 of a batch of 3"},
		"a cut proof": {func() *bcdv1.Command {
			c := proto.Clone(two[0]).(*bcdv1.Command)
			c.Batch.Proof = c.Batch.Proof[:1]
			return c
		}(), "not leaf 0"},
		"a forged header": {func() *bcdv1.Command {
			c := proto.Clone(two[0]).(*bcdv1.Command)
			c.Batch.Header = []byte(strings.Replace(string(c.Batch.Header), `"count":3`, `"count":4`, 1))
			return c
		}(), "valid approvals"},
	} {
		_, err := Verify(tc.c, s, now)
		if !errors.Is(err, ErrUnapproved) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

func TestLedgerSpendsOnceAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	lg, err := OpenLedger(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	v := Verified{BatchID: "b1", Index: 2, NotAfter: now.Add(time.Hour)}
	if err := lg.Spend(v, "cmd_1", now); err != nil {
		t.Fatal(err)
	}
	if err := lg.Spend(v, "cmd_2", now); !errors.Is(err, ErrUnapproved) || !strings.Contains(err.Error(), "cmd_1") {
		t.Errorf("spent twice: %v", err)
	}
	lg2, _ := OpenLedger(dir)
	if err := lg2.Spend(v, "cmd_3", now); !errors.Is(err, ErrUnapproved) {
		t.Errorf("after reopening: %v", err)
	}
	if err := lg2.Spend(Verified{BatchID: "b1", Index: 3, NotAfter: now.Add(time.Hour)}, "cmd_4", now); err != nil {
		t.Errorf("another leaf: %v", err)
	}
}

func TestUnbatchedPerRollingHour(t *testing.T) {
	lg, _ := OpenLedger(t.TempDir())
	now := time.Now()
	if err := lg.Unbatched(0, now); !errors.Is(err, ErrUnapproved) {
		t.Errorf("limit 0: %v", err)
	}
	for i := range 2 {
		if err := lg.Unbatched(2, now.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if err := lg.Unbatched(2, now.Add(5*time.Minute)); !errors.Is(err, ErrUnapproved) {
		t.Errorf("a third in the hour: %v", err)
	}
	if err := lg.Unbatched(2, now.Add(61*time.Minute)); err != nil {
		t.Errorf("an hour after the first: %v", err)
	}
}

func TestEndorsed(t *testing.T) {
	ks, ders := keys(t, 3)
	held := set(t, ders, 2, 1)
	_, next := keys(t, 2)
	e0, _ := Endorse(ks[0], 2, 1, next)
	e1, _ := Endorse(ks[1], 2, 1, next)
	if err := Endorsed(held, 2, 1, next, [][]byte{e0, e1}); err != nil {
		t.Errorf("two of three: %v", err)
	}
	if err := Endorsed(held, 2, 1, next, [][]byte{e0}); err == nil {
		t.Error("one of a threshold of two taken")
	}
	if err := Endorsed(held, 2, 2, next, [][]byte{e0, e1}); err == nil {
		t.Error("endorsements of another threshold taken")
	}
	if err := Endorsed(held, 1, 1, next, [][]byte{e0, e1}); err == nil {
		t.Error("the same epoch taken")
	}
}

// FuzzVerify: a batch leaf of any bytes never panics and never verifies
// without the threshold of approvals over its own leaf.
func FuzzVerify(f *testing.F) {
	ks, ders := keys(f, 2)
	s := set(f, ders, 2, 1)
	c := wipe("n1", "/dev/vdb")
	hb := batch(f, []*bcdv1.Command{c, wipe("n2", "/dev/vdb")}, time.Now().Add(time.Hour), ks[0], ks[1])
	f.Add(hb, uint32(0), c.Batch.Proof[0], c.Batch.Approvals[0], c.Batch.Approvals[1])
	f.Add([]byte(`{"v":1}`), uint32(9), []byte{}, []byte{1}, []byte{})
	f.Fuzz(func(t *testing.T, header []byte, index uint32, proof, a0, a1 []byte) {
		x := wipe("n1", "/dev/vdb")
		x.Batch = &bcdv1.BatchLeaf{Header: header, Index: index, Proof: [][]byte{proof}, Approvals: [][]byte{a0, a1}}
		if _, err := Verify(x, s, time.Now()); err == nil {
			if string(header) != string(hb) {
				t.Fatalf("a header that was never approved verified: %q", header)
			}
		}
		_, _ = DecodeHeader(header)
	})
}
