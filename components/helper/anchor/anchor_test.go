package anchor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/better-compute/bcd/components/trust/pki/es256"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// signed is a bundle naming root, signed by join, and a proof of a spec
// of sections at gen signed by root.
func signed(t *testing.T, join, root *ecdsa.PrivateKey, gen uint64, sections map[string]string) rootsig.Proof {
	t.Helper()
	rs, _ := es256.MarshalSPKI(root.Public())
	js, _ := es256.MarshalSPKI(join.Public())
	doc, _ := json.Marshal(map[string]any{"version": 1, "command_signing_roots": [][]byte{rs}})
	bs, _ := es256.Sign(join, rootsig.PurposeTrustBundle, doc)
	full := map[string]json.RawMessage{}
	for k, v := range sections {
		full[k] = json.RawMessage(v)
	}
	d, _ := rootsig.SectionDigests(full)
	sum := sha256.Sum256([]byte("spec"))
	p := rootsig.Proof{NodeID: "node_a", Generation: gen, SpecSHA256: sum[:], Sections: d,
		Bundle: &rootsig.Bundle{Document: doc, SigningKey: js, Signature: bs}}
	sig, _ := es256.Sign(root, rootsig.PurposeDesiredState, p.Message())
	id := rootsig.KeyID(rs)
	p.Signature = append(id[:], sig...)
	return p
}

// TestConcurrentSectionsKeepEachOther: two requests open the anchors at
// once, admit different sections and commit: both generations are
// recorded (each request re-reads what the other wrote), so neither
// section's replay floor is lost.
func TestConcurrentSectionsKeepEachOther(t *testing.T) {
	join, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	root, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	js, _ := es256.MarshalSPKI(join.Public())
	dir := t.TempDir()
	secs := map[string]string{"access": `{"ssh":{}}`, "host": `{"units":{}}`}
	p := signed(t, join, root, 5, secs)
	a, _ := Open(dir, rootsig.Pin(js), nil)
	b, _ := Open(dir, rootsig.Pin(js), nil)
	ca, err := a.Admit(p, "access", []byte(secs["access"]))
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.Admit(p, "host", []byte(secs["host"]))
	if err != nil {
		t.Fatal(err)
	}
	if err := ca(); err != nil {
		t.Fatal(err)
	}
	if err := cb(); err != nil {
		t.Fatal(err)
	}
	var got map[string]applied
	raw, _ := os.ReadFile(filepath.Join(dir, AppliedFile))
	json.Unmarshal(raw, &got)
	if got["access"].Generation != 5 || got["host"].Generation != 5 {
		t.Fatalf("applied.json %s: a request lost the other's section", raw)
	}
	// An older generation of either is now refused by a fresh open.
	c, _ := Open(dir, rootsig.Pin(js), nil)
	if _, err := c.Admit(signed(t, join, root, 4, secs), "access", []byte(secs["access"])); err == nil {
		t.Error("an older access section admitted")
	}
}

// TestRecordOfAnotherFleetDropsItsBundle: a machine that joins a gateway
// of another fleet (another join-signing key) gets a join record under
// the new pin; the bundle and generations root held from the old fleet
// go with it, so the new fleet's signed sections are admitted, from
// generation 1. A record from the same fleet keeps the bundle.
func TestRecordOfAnotherFleetDropsItsBundle(t *testing.T) {
	record := func(join *ecdsa.PrivateKey) rootsig.JoinRecord {
		js, _ := es256.MarshalSPKI(join.Public())
		result := append([]byte{0x0a, byte(len("node_a"))}, "node_a"...)
		sig, _ := es256.Sign(join, rootsig.PurposeJoinResponse, result)
		return rootsig.JoinRecord{V: 1, NodeID: "node_a", Result: result, Signature: sig, SigningKey: js}
	}
	admit := func(dir string, join, root *ecdsa.PrivateKey, gen uint64) error {
		js, _ := es256.MarshalSPKI(join.Public())
		a, err := Open(dir, rootsig.Pin(js), nil)
		if err != nil {
			return err
		}
		secs := map[string]string{"host": `{"units":{}}`}
		commit, err := a.Admit(signed(t, join, root, gen, secs), "host", []byte(secs["host"]))
		if err != nil {
			return err
		}
		return commit()
	}
	join1, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	root1, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	join2, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	root2, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	dir := t.TempDir()
	if err := WriteRecord(dir, record(join1)); err != nil {
		t.Fatal(err)
	}
	if err := admit(dir, join1, root1, 5); err != nil {
		t.Fatalf("the first fleet's section: %v", err)
	}
	// Joined again to the same fleet: its bundle stays.
	if err := WriteRecord(dir, record(join1)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, BundleFile)); err != nil {
		t.Fatalf("a record of the same fleet dropped its bundle: %v", err)
	}
	// Joined to another fleet.
	if err := WriteRecord(dir, record(join2)); err != nil {
		t.Fatal(err)
	}
	if err := admit(dir, join2, root2, 1); err != nil {
		t.Fatalf("the new fleet's first section after its join record: %v", err)
	}
}
