//go:build linux

package helper

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/better-compute/bcd/components/trust/pki/es256"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// intentSigner stands in for bcgw: the join-signing key root pins, a trust
// bundle naming command-signing roots, and specs signed for one node.
type intentSigner struct {
	join, root *ecdsa.PrivateKey
	pin        string
	node       string
	bundle     *rootsig.Bundle
	gen        uint64
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func spkiOf(t *testing.T, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	b, err := es256.MarshalSPKI(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newIntentSigner(t *testing.T, node string) *intentSigner {
	s := &intentSigner{join: newKey(t), root: newKey(t), node: node}
	s.pin = rootsig.Pin(spkiOf(t, s.join))
	b := s.signBundle(t, s.join, 1, s.root)
	s.bundle = &b
	return s
}

// signBundle is a trust bundle of version naming roots, signed by by.
func (s *intentSigner) signBundle(t *testing.T, by *ecdsa.PrivateKey, version uint64, roots ...*ecdsa.PrivateKey) rootsig.Bundle {
	t.Helper()
	d := struct {
		Version uint64   `json:"version"`
		Roots   [][]byte `json:"command_signing_roots"`
	}{Version: version, Roots: [][]byte{}}
	for _, r := range roots {
		d.Roots = append(d.Roots, spkiOf(t, r))
	}
	doc, _ := json.Marshal(d)
	sig, err := es256.Sign(by, rootsig.PurposeTrustBundle, doc)
	if err != nil {
		t.Fatal(err)
	}
	return rootsig.Bundle{Document: doc, SigningKey: spkiOf(t, by), Signature: sig}
}

// proof is the proof of the next generation of a full spec of sections,
// signed by by (nil: unsigned), with the signer's bundle.
func (s *intentSigner) proof(t *testing.T, sections map[string]string, by *ecdsa.PrivateKey) rootsig.Proof {
	t.Helper()
	s.gen++
	full := map[string]json.RawMessage{}
	for k, v := range sections {
		full[k] = json.RawMessage(v)
	}
	raw, _ := json.Marshal(full)
	sum := sha256.Sum256(raw)
	d, err := rootsig.SectionDigests(full)
	if err != nil {
		t.Fatal(err)
	}
	p := rootsig.Proof{NodeID: s.node, Generation: s.gen, SpecSHA256: sum[:], Sections: d, Bundle: s.bundle}
	if by != nil {
		sig, err := es256.Sign(by, rootsig.PurposeDesiredState, p.Message())
		if err != nil {
			t.Fatal(err)
		}
		id := rootsig.KeyID(spkiOf(t, by))
		p.Signature = append(id[:], sig...)
	}
	return p
}

// accessRequest is access.apply with section and its proof.
func accessRequest(t *testing.T, section string, p rootsig.Proof) string {
	t.Helper()
	pj, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	sec := ""
	if section != "" {
		sec = `"section":"` + base64.StdEncoding.EncodeToString([]byte(section)) + `",`
	}
	return fmt.Sprintf(`{"v":1,"op":"access.apply",%s"proof":%s}`, sec, pj)
}

// signedAccess is access.apply of an access section whose ssh object is
// ssh, in the next generation signed by the signer's root.
func (s *intentSigner) signedAccess(t *testing.T, ssh string) string {
	t.Helper()
	section := `{"ssh":` + ssh + `}`
	return accessRequest(t, section, s.proof(t, map[string]string{"access": section}, s.root))
}

// anchorDir gives o's helper root's trust anchors under its top directory
// with sig's join-signing pin, and returns the directory.
func (o *opServer) anchoredBy(sig *intentSigner) string {
	dir := filepath.Join(o.srv.s.top, "state")
	o.srv.cfg.StateDir, o.srv.cfg.JoinSigningPin = dir, sig.pin
	return dir
}
