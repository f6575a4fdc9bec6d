package bundle

import (
	"crypto"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/quorum"
)

func spki(t testing.TB, k crypto.Signer) []byte {
	t.Helper()
	b, _ := x509.MarshalPKIXPublicKey(k.Public())
	return b
}

func TestHeldTakesOnlyNewerVerifiedBundles(t *testing.T) {
	join, _ := pki.GenerateKey()
	other, _ := pki.GenerateKey()
	root, _ := pki.GenerateKey()
	pin, _ := pki.Pin(join.Public())
	dir := t.TempDir()
	h, err := Load(dir, pin)
	if err != nil || h.Version() != 0 || h.Enforced() {
		t.Fatalf("fresh: %v %d %v", err, h.Version(), h.Enforced())
	}
	v2, _ := Sign(join, Document{Version: 2, CommandSigningRoots: [][]byte{spki(t, root)}})
	if took, err := h.Offer(v2); !took || err != nil || !h.Enforced() || h.Version() != 2 {
		t.Fatalf("v2: %v %v", took, err)
	}
	if h.Taken() != 2 || h.Taken() != 0 {
		t.Error("Taken does not report a new version exactly once")
	}
	if took, err := h.Offer(v2); took || err != nil {
		t.Errorf("the held bundle again: %v %v", took, err)
	}
	v1, _ := Sign(join, Document{Version: 1})
	if _, err := h.Offer(v1); !errors.Is(err, ErrOlder) || h.Version() != 2 {
		t.Errorf("older: %v, holding %d", err, h.Version())
	}
	forged, _ := Sign(other, Document{Version: 9})
	if _, err := h.Offer(forged); err == nil || !strings.Contains(err.Error(), "join_signing_key_pin") || h.Version() != 2 {
		t.Errorf("signed by another key: %v, holding %d", err, h.Version())
	}
	tampered, _ := Sign(join, Document{Version: 3})
	tampered.Document = []byte(`{"version":4,"command_signing_roots":null}`)
	if _, err := h.Offer(tampered); err == nil || h.Version() != 2 {
		t.Errorf("tampered: %v", err)
	}
	same, _ := Sign(join, Document{Version: 2})
	if _, err := h.Offer(same); err == nil || h.Version() != 2 || !h.Enforced() {
		t.Errorf("another document at the held version: %v", err)
	}
	off, _ := Sign(join, Document{Version: 5})
	if _, err := h.Offer(off); err == nil || !strings.Contains(err.Error(), "no command-signing roots") || !h.Enforced() {
		t.Errorf("a bundle switching signed intent off: %v", err)
	}
	// A restart holds the same bundle; a damaged file is an error, never
	// a silent fall back to enforcing nothing.
	h2, err := Load(dir, pin)
	if err != nil || h2.Version() != 2 || !h2.Enforced() {
		t.Fatalf("reload: %v %d", err, h2.Version())
	}
	b, _ := os.ReadFile(filepath.Join(dir, File))
	os.WriteFile(filepath.Join(dir, File), []byte(strings.Replace(string(b), `"signature":"`, `"signature":"AA`, 1)), 0o600)
	if _, err := Load(dir, pin); err == nil {
		t.Error("a damaged held bundle loaded")
	}
}

func TestDecodeRefuses(t *testing.T) {
	for doc, want := range map[string]string{
		`{"version":0}`:                                                 "no version",
		`{"version":1,"extra":1}`:                                       "unknown field",
		`{"version":1,"command_signing_roots":["AAAA"]}`:                "root 0",
		`{"version":1,"approvers":{"epoch":1,"threshold":2,"keys":[]}}`: "approver keys",
		`{"version":1} {}`:                                              "data after",
		`[]`:                                                            "cannot unmarshal",
	} {
		if _, err := Decode([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Decode(%s) = %v, want %q", doc, err, want)
		}
	}
}

// FuzzDecode: the bundle document decoder never panics, and what it
// accepts has a version and parseable roots.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1,"command_signing_roots":[]}`))
	f.Add([]byte(`{"version":3,"approvers":{"epoch":1,"threshold":1,"keys":["AAAA"]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err == nil && (d.Version == 0 || d.Roots() == nil) {
			t.Fatalf("accepted %q without a version or roots", b)
		}
	})
}

// TestApproverSetChanges: the first set comes with a bundle the pinned key
// signed; a change at a higher epoch needs the held threshold of
// endorsements; a refused set keeps the held quorum while the bundle's
// roots and version apply; the set in force survives a restart.
func TestApproverSetChanges(t *testing.T) {
	join, _ := pki.GenerateKey()
	pin, _ := pki.Pin(join.Public())
	dir := t.TempDir()
	h, _ := Load(dir, pin)
	var ks []crypto.Signer
	var ders [][]byte
	for range 5 {
		k, _ := pki.GenerateKey()
		ks, ders = append(ks, k), append(ders, spki(t, k))
	}
	root, _ := pki.GenerateKey()
	first := &Approvers{Epoch: 1, Threshold: 2, Keys: ders[:3]}
	tb, _ := Sign(join, Document{Version: 1, CommandSigningRoots: [][]byte{spki(t, root)}, Approvers: first})
	if _, err := h.Offer(tb); err != nil || h.Approvers() == nil || h.Approvers().Epoch != 1 {
		t.Fatalf("first set: %v %+v", err, h.Approvers())
	}
	next := &Approvers{Epoch: 2, Threshold: 1, Keys: ders[3:]}
	one, _ := quorum.Endorse(ks[0], 2, 1, ders[3:])
	next.Endorsements = [][]byte{one}
	tb, _ = Sign(join, Document{Version: 2, CommandSigningRoots: [][]byte{spki(t, root), spki(t, join)}, Approvers: next})
	if took, err := h.Offer(tb); !took || err != nil {
		t.Fatalf("v2: %v %v", took, err)
	}
	if a := h.Approvers(); a.Epoch != 1 || !strings.Contains(h.ApproversRefused(), "endorsed by 1") {
		t.Errorf("a set endorsed by one of a threshold of two: in force epoch %d, refusal %q", a.Epoch, h.ApproversRefused())
	}
	if h.Version() != 2 || h.Roots().Len() != 2 {
		t.Errorf("the bundle's roots and version did not apply: v%d %d roots", h.Version(), h.Roots().Len())
	}
	two, _ := quorum.Endorse(ks[1], 2, 1, ders[3:])
	next.Endorsements = [][]byte{one, two}
	tb, _ = Sign(join, Document{Version: 3, CommandSigningRoots: [][]byte{spki(t, root)}, Approvers: next})
	h.Offer(tb)
	if a := h.Approvers(); a.Epoch != 2 || h.ApproversRefused() != "" {
		t.Errorf("a set endorsed by two: in force epoch %d, refusal %q", a.Epoch, h.ApproversRefused())
	}
	// A bundle without approvers does not drop the quorum.
	tb, _ = Sign(join, Document{Version: 4, CommandSigningRoots: [][]byte{spki(t, root)}})
	h.Offer(tb)
	if a := h.Approvers(); a == nil || a.Epoch != 2 {
		t.Errorf("a bundle without approvers dropped the set: %+v", a)
	}
	h2, err := Load(dir, pin)
	if err != nil || h2.Approvers() == nil || h2.Approvers().Epoch != 2 {
		t.Errorf("after a restart: %v %+v", err, h2.Approvers())
	}
}
