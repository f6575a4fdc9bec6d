package rootsig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/trust/pki/es256"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"google.golang.org/protobuf/proto"
)

func key(t *testing.T) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	spki, err := es256.MarshalSPKI(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return k, spki
}

func TestCanonical(t *testing.T) {
	for _, tt := range []struct{ a, b string }{
		{`{"b":1,"a":[1,2]}`, ` { "a" : [1, 2], "b":1 } `},
		{`{"x":"<&>"}`, `{"x":"\u003c\u0026\u003e"}`},
		{`{"n":1.50}`, `{"n":1.50}`},
	} {
		ca, err := Canonical([]byte(tt.a))
		cb, err2 := Canonical([]byte(tt.b))
		if err != nil || err2 != nil || string(ca) != string(cb) {
			t.Errorf("%s -> %s, %s -> %s (%v %v)", tt.a, ca, tt.b, cb, err, err2)
		}
	}
	for _, bad := range []string{``, `{`, `{} {}`, `nul`} {
		if _, err := Canonical([]byte(bad)); err == nil {
			t.Errorf("Canonical(%q) succeeded", bad)
		}
	}
}

func TestVerifySection(t *testing.T) {
	k, spki := key(t)
	roots, _ := ParseRoots([][]byte{spki})
	d, _ := SectionDigests(map[string]json.RawMessage{"access": json.RawMessage(`{"ssh":{}}`)})
	p := Proof{NodeID: "n", Generation: 3, SpecSHA256: make([]byte, 32), Sections: d}
	sig, _ := es256.Sign(k, PurposeDesiredState, p.Message())
	id := KeyID(spki)
	p.Signature = append(id[:], sig...)
	if err := roots.VerifySection(p, "access", []byte(` {"ssh": {}} `)); err != nil {
		t.Fatal(err)
	}
	if err := roots.VerifySection(p, "access", []byte(`{"ssh":{"user_ca":"x"}}`)); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("other content: %v", err)
	}
	if err := roots.VerifySection(p, "host", nil); err != nil {
		t.Errorf("an absent section: %v", err)
	}
	if err := roots.VerifySection(p, "host", []byte(`{}`)); err == nil {
		t.Error("a section the spec does not have passed")
	}
	q := p
	q.Generation = 4
	if err := roots.VerifySection(q, "access", []byte(`{"ssh":{}}`)); err == nil || !strings.Contains(err.Error(), "BAD_SIGNATURE") {
		t.Errorf("another generation: %v", err)
	}
	q = p
	q.Signature = nil
	if err := roots.VerifySection(q, "access", []byte(`{"ssh":{}}`)); err != ErrUnsigned {
		t.Errorf("unsigned: %v", err)
	}
}

// TestJoinRecord: a record made of a real JoinResponse verifies; another
// node id, another key or a changed result does not.
func TestJoinRecord(t *testing.T) {
	k, spki := key(t)
	res, _ := proto.Marshal(&bcdv1.JoinResult{NodeId: "node_abc", Site: "s1", Role: "node", Certificate: []byte("der"), NotAfterUnix: 9})
	sig, _ := es256.Sign(k, PurposeJoinResponse, res)
	rec := JoinRecord{V: 1, NodeID: "node_abc", Result: res, Signature: sig, SigningKey: spki}
	pin := Pin(spki)
	if err := VerifyJoinRecord(rec, pin); err != nil {
		t.Fatal(err)
	}
	_, other := key(t)
	for name, f := range map[string]func(r *JoinRecord) string{
		"another node":     func(r *JoinRecord) string { r.NodeID = "node_ab"; return pin },
		"another pin":      func(r *JoinRecord) string { return Pin(other) },
		"a changed result": func(r *JoinRecord) string { r.Result = append(r.Result, 0); return pin },
		"no version":       func(r *JoinRecord) string { r.V = 0; return pin },
	} {
		r := rec
		r.Result = append([]byte(nil), rec.Result...)
		if err := VerifyJoinRecord(r, f(&r)); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}

// FuzzDecodeProof: the decoder never panics, and what it accepts encodes
// and decodes again to the same message.
func FuzzDecodeProof(f *testing.F) {
	f.Add([]byte(`{"node_id":"n","generation":1,"patch":false,"base_generation":0,"spec_sha256":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","sections":{}}`))
	f.Add([]byte(`{"node_id":"n","generation":1,"sections":{"a":"x"}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeProof(b)
		if err != nil {
			return
		}
		j, _ := json.Marshal(p)
		q, err := DecodeProof(j)
		if err != nil || string(q.Message()) != string(p.Message()) {
			t.Fatalf("accepted %q; again: %v", b, err)
		}
		if len(p.SpecSHA256) != sha256.Size {
			t.Fatal("a spec digest of the wrong size accepted")
		}
	})
}

// FuzzVerifyJoinRecord: never panics on any record.
func FuzzVerifyJoinRecord(f *testing.F) {
	f.Add([]byte(`{"v":1,"node_id":"n","result":"CgFu","signature":"","signing_key":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r JoinRecord
		if json.Unmarshal(b, &r) == nil {
			_ = VerifyJoinRecord(r, "sha256/AAAA")
		}
	})
}

// TestNextBundle: the rule the agent and root share for a newer bundle.
func TestNextBundle(t *testing.T) {
	a, b := []byte(`{"version":2,"a":1}`), []byte(`{"version":2,"b":1}`)
	held := Held{Version: 2, Document: a, HasRoots: true}
	for _, tt := range []struct {
		name  string
		next  Held
		take  bool
		older bool
		err   bool
	}{
		{"newer", Held{Version: 3, Document: b, HasRoots: true}, true, false, false},
		{"the same again", Held{Version: 2, Document: a, HasRoots: true}, false, false, false},
		{"another at the held version", Held{Version: 2, Document: b, HasRoots: true}, false, false, true},
		{"older", Held{Version: 1, Document: b, HasRoots: true}, false, true, true},
		{"newer without roots", Held{Version: 3, Document: b}, false, false, true},
	} {
		take, err := NextBundle(held, tt.next)
		if take != tt.take || (err != nil) != tt.err || errors.Is(err, ErrOlderBundle) != tt.older {
			t.Errorf("%s: take %v err %v", tt.name, take, err)
		}
	}
	if take, err := NextBundle(Held{}, Held{Version: 1, Document: a}); !take || err != nil {
		t.Errorf("a first bundle without roots: %v %v", take, err)
	}
}
