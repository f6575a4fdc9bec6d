package intent

import (
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"testing"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"google.golang.org/protobuf/proto"
)

func spki(t testing.TB, k crypto.Signer) []byte {
	t.Helper()
	b, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCommandSignatures(t *testing.T) {
	root, _ := pki.GenerateKey()
	other, _ := pki.GenerateKey()
	roots, err := ParseRoots([][]byte{spki(t, root)})
	if err != nil {
		t.Fatal(err)
	}
	c := &bcdv1.Command{Id: "cmd_1", NodeId: "node_a", Kind: "disk.wipe", Body: []byte(`{"devices":["/dev/sda"]}`), DeadlineUnixMs: 1000, Lane: "provision"}
	if err := roots.VerifyCommand(c); !errors.Is(err, ErrUnsigned) {
		t.Fatalf("unsigned: %v", err)
	}
	c.Signature, _ = SignCommand(root, c)
	if err := roots.VerifyCommand(c); err != nil {
		t.Fatalf("signed by a root: %v", err)
	}
	mutate := map[string]func(*bcdv1.Command){
		"another node":     func(x *bcdv1.Command) { x.NodeId = "node_b" },
		"a later deadline": func(x *bcdv1.Command) { x.DeadlineUnixMs = 2000 },
		"another body":     func(x *bcdv1.Command) { x.Body = []byte(`{"devices":["/dev/sdb"]}`) },
		"another kind":     func(x *bcdv1.Command) { x.Kind = "deploy.image" },
		"another id":       func(x *bcdv1.Command) { x.Id = "cmd_2" },
		"another lane":     func(x *bcdv1.Command) { x.Lane = "control" },
		"another workflow": func(x *bcdv1.Command) { x.WorkflowId = "wf" },
		"a cut signature":  func(x *bcdv1.Command) { x.Signature = x.Signature[:10] },
		"a flipped bit":    func(x *bcdv1.Command) { x.Signature[40] ^= 1 },
	}
	for name, m := range mutate {
		x := proto.Clone(c).(*bcdv1.Command)
		m(x)
		if err := roots.VerifyCommand(x); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: %v, want BAD_SIGNATURE", name, err)
		}
	}
	x := proto.Clone(c).(*bcdv1.Command)
	x.Signature, _ = SignCommand(other, x)
	if err := roots.VerifyCommand(x); !errors.Is(err, ErrBadSignature) {
		t.Errorf("signed by a key that is not a root: %v", err)
	}
	// No roots: anything goes, as before signed intent.
	if err := (&Roots{}).VerifyCommand(&bcdv1.Command{}); err != nil {
		t.Errorf("no roots: %v", err)
	}
}

func TestDesiredStateSignatures(t *testing.T) {
	root, _ := pki.GenerateKey()
	roots, _ := ParseRoots([][]byte{spki(t, root)})
	ds := &bcdv1.DesiredState{Generation: 4, Patch: true, BaseGeneration: 3, Spec: []byte(`{"fakehw":{}}`)}
	full := nodespec.Spec{"fakehw": json.RawMessage(`{}`), "access": json.RawMessage(`{"ssh":{"user_ca":"x"}}`)}
	ds.Signature, _ = SignDesiredState(root, "node_a", ds, full)
	if err := roots.VerifyDesiredState("node_a", ds, full); err != nil {
		t.Fatal(err)
	}
	// The same section in another JSON form is the same section.
	same := nodespec.Spec{"fakehw": json.RawMessage(` { } `), "access": json.RawMessage(`{ "ssh" : {"user_ca":"x"} }`)}
	if err := roots.VerifyDesiredState("node_a", ds, same); err != nil {
		t.Errorf("the same spec in another JSON form: %v", err)
	}
	if err := roots.VerifyDesiredState("node_b", ds, full); !errors.Is(err, ErrBadSignature) {
		t.Errorf("for another node: %v", err)
	}
	for name, m := range map[string]func(*bcdv1.DesiredState){
		"generation": func(x *bcdv1.DesiredState) { x.Generation = 5 },
		"patch":      func(x *bcdv1.DesiredState) { x.Patch = false },
		"base":       func(x *bcdv1.DesiredState) { x.BaseGeneration = 2 },
		"spec":       func(x *bcdv1.DesiredState) { x.Spec = []byte(`{}`) },
	} {
		x := proto.Clone(ds).(*bcdv1.DesiredState)
		m(x)
		if err := roots.VerifyDesiredState("node_a", x, full); !errors.Is(err, ErrBadSignature) {
			t.Errorf("another %s: %v", name, err)
		}
	}
	// The full spec it makes is signed too: another section's content,
	// a section more or less, each fails.
	for name, f := range map[string]nodespec.Spec{
		"access content": {"fakehw": json.RawMessage(`{}`), "access": json.RawMessage(`{"ssh":{"user_ca":"y"}}`)},
		"section less":   {"fakehw": json.RawMessage(`{}`)},
		"section more":   {"fakehw": json.RawMessage(`{}`), "access": json.RawMessage(`{"ssh":{"user_ca":"x"}}`), "host": json.RawMessage(`{}`)},
	} {
		if err := roots.VerifyDesiredState("node_a", ds, f); !errors.Is(err, ErrBadSignature) {
			t.Errorf("full spec with %s: %v", name, err)
		}
	}
}

func TestParseRootsRefuses(t *testing.T) {
	if _, err := ParseRoots([][]byte{[]byte("junk")}); err == nil {
		t.Error("junk root taken")
	}
	many := make([][]byte, MaxRoots+1)
	if _, err := ParseRoots(many); err == nil {
		t.Error("too many roots taken")
	}
}

// FuzzVerify: the signed-intent envelope never panics on any signature
// field or command, and only a root's signature verifies.
func FuzzVerify(f *testing.F) {
	root, _ := pki.GenerateKey()
	roots, _ := ParseRoots([][]byte{spki(f, root)})
	good := &bcdv1.Command{Id: "a", NodeId: "n", Kind: "k"}
	sig, _ := SignCommand(root, good)
	f.Add([]byte(nil), "a", "n", []byte("{}"))
	f.Add(sig, "a", "n", []byte(nil))
	f.Add(sig[:SignatureSize-1], "a", "n", []byte(nil))
	f.Fuzz(func(t *testing.T, s []byte, id, node string, body []byte) {
		c := &bcdv1.Command{Id: id, NodeId: node, Kind: "k", Body: body, Signature: s}
		err := roots.VerifyCommand(c)
		if err == nil && (id != "a" || node != "n" || len(body) != 0) {
			t.Fatalf("a signature verified for another command: %q %q %q", id, node, body)
		}
		_, _, _ = ParseSignature(s)
	})
}

func TestCancelSignatures(t *testing.T) {
	root, _ := pki.GenerateKey()
	roots, _ := ParseRoots([][]byte{spki(t, root)})
	c := &bcdv1.Cancel{CommandId: "cmd_1", Reason: "operator"}
	if err := roots.VerifyCancel("node_a", c); !errors.Is(err, ErrUnsigned) {
		t.Fatalf("unsigned: %v", err)
	}
	c.Signature, _ = SignCancel(root, "node_a", c)
	if err := roots.VerifyCancel("node_a", c); err != nil {
		t.Fatal(err)
	}
	if err := roots.VerifyCancel("node_b", c); !errors.Is(err, ErrBadSignature) {
		t.Errorf("for another node: %v", err)
	}
	c.CommandId = "cmd_2"
	if err := roots.VerifyCancel("node_a", c); !errors.Is(err, ErrBadSignature) {
		t.Errorf("for another command: %v", err)
	}
}
