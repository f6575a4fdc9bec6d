package identity_test

import (
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
)

var ca *pki.CA

func TestMain(m *testing.M) {
	var err error
	if ca, err = pki.NewCA("identity test CA", time.Hour); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// issued makes a key and a node certificate for it.
func issued(t *testing.T, nodeID string) (crypto.Signer, *x509.Certificate) {
	t.Helper()
	k, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.IssueClient(k.Public(), nodeID, pki.SPIFFEID("bcgw.lab", "node", nodeID), "lab", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return k, c
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // Save makes it
	k, c := issued(t, "node_a")
	joined := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	id := identity.Identity{NodeID: "node_a", Site: "fsn1", Role: "node", SPIFFEID: "spiffe://bcgw.lab/node/node_a", JoinedAt: joined}
	saved, err := identity.Save(dir, k, c, id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := identity.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeID != "node_a" || got.Site != "fsn1" || got.Role != "node" || got.SPIFFEID != id.SPIFFEID || !got.JoinedAt.Equal(joined) {
		t.Errorf("loaded %+v", got.Identity)
	}
	if !got.NotAfter.Equal(c.NotAfter) || !got.Cert.Equal(c) || got.CertificatePEM != saved.CertificatePEM {
		t.Error("loaded certificate differs from the saved one")
	}
	if !got.Key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(k.Public()) {
		t.Error("loaded key differs from the saved one")
	}
	tc := got.TLSCertificate()
	if len(tc.Certificate) != 1 || tc.Leaf != got.Cert || tc.PrivateKey != got.Key {
		t.Error("TLSCertificate does not carry the loaded certificate and key")
	}
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("data dir mode %v %v, want 0700", st.Mode().Perm(), err)
	}
	for _, f := range []string{identity.KeyFile, identity.IdentityFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %04o, want 0600", f, st.Mode().Perm())
		}
	}
	// No temp files are left beside them.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("data dir holds %v, want only the two files", names)
	}

	// Saving again replaces the identity.
	k2, c2 := issued(t, "node_b")
	if _, err := identity.Save(dir, k2, c2, identity.Identity{NodeID: "node_b", Role: "node"}); err != nil {
		t.Fatal(err)
	}
	if got, err := identity.Load(dir); err != nil || got.NodeID != "node_b" || !got.Cert.Equal(c2) {
		t.Errorf("after a second Save: %v %v", got, err)
	}
}

func TestLoadRefuses(t *testing.T) {
	k, c := issued(t, "node_a")
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string)
		want    string
	}{
		{"certificate for another key", func(t *testing.T, dir string) {
			if _, err := identity.Save(dir, k, c, identity.Identity{NodeID: "node_a", Role: "node"}); err != nil {
				t.Fatal(err)
			}
			otherKey, _ := issued(t, "node_c")
			kb, _ := pki.MarshalPrivateKeyPEM(otherKey)
			if err := identity.WriteFileAtomic(filepath.Join(dir, identity.KeyFile), kb, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "certificate is not for"},
		{"no node id", func(t *testing.T, dir string) {
			if _, err := identity.Save(dir, k, c, identity.Identity{Role: "node"}); err != nil {
				t.Fatal(err)
			}
		}, "node_id and role are required"},
		{"no role", func(t *testing.T, dir string) {
			if _, err := identity.Save(dir, k, c, identity.Identity{NodeID: "node_a"}); err != nil {
				t.Fatal(err)
			}
		}, "node_id and role are required"},
		{"key file missing", func(t *testing.T, dir string) {
			if _, err := identity.Save(dir, k, c, identity.Identity{NodeID: "node_a", Role: "node"}); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(dir, identity.KeyFile)); err != nil {
				t.Fatal(err)
			}
		}, identity.KeyFile},
		{"identity.json not JSON", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, identity.IdentityFile), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "parse"},
		{"no certificate in identity.json", func(t *testing.T, dir string) {
			if _, err := identity.Save(dir, k, c, identity.Identity{NodeID: "node_a", Role: "node"}); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, identity.IdentityFile)
			var m map[string]any
			b, _ := os.ReadFile(p)
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			m["certificate_pem"] = ""
			b, _ = json.Marshal(m)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "no certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.prepare(t, dir)
			a, err := identity.Load(dir)
			if err == nil {
				t.Fatalf("Load succeeded: %+v", a.Identity)
			}
			if errors.Is(err, identity.ErrNotJoined) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load err = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestLoadEmptyDirIsNotJoined(t *testing.T) {
	for name, dir := range map[string]string{"empty": t.TempDir(), "missing": filepath.Join(t.TempDir(), "nope")} {
		if _, err := identity.Load(dir); !errors.Is(err, identity.ErrNotJoined) {
			t.Errorf("%s dir: %v, want ErrNotJoined", name, err)
		}
	}
}

// TestSaveCrashAtEachStepKeepsAnIdentity recreates the state Save leaves
// when the process dies after each of its steps; an identity must load
// every time (the old one before identity.json is replaced, the new one
// after).
func TestSaveCrashAtEachStepKeepsAnIdentity(t *testing.T) {
	k2, c2 := issued(t, "node_b")
	kb, err := pki.MarshalPrivateKeyPEM(k2)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		crash    func(t *testing.T, dir string)
		wantNode string
	}{
		{"after node.key.next", func(t *testing.T, dir string) {
			if err := identity.WriteFileAtomic(filepath.Join(dir, identity.KeyFile+".next"), kb, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "node_a"},
		{"after identity.json", func(t *testing.T, dir string) {
			if err := identity.WriteFileAtomic(filepath.Join(dir, identity.KeyFile+".next"), kb, 0o600); err != nil {
				t.Fatal(err)
			}
			// What Save writes as identity.json for the new certificate.
			tmp := t.TempDir()
			if _, err := identity.Save(tmp, k2, c2, identity.Identity{NodeID: "node_b", Role: "node"}); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(tmp, identity.IdentityFile))
			if err != nil {
				t.Fatal(err)
			}
			if err := identity.WriteFileAtomic(filepath.Join(dir, identity.IdentityFile), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "node_b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			k1, c1 := issued(t, "node_a")
			if _, err := identity.Save(dir, k1, c1, identity.Identity{NodeID: "node_a", Role: "node"}); err != nil {
				t.Fatal(err)
			}
			tc.crash(t, dir)
			a, err := identity.Load(dir)
			if err != nil {
				t.Fatalf("after a crash inside Save no identity loads: %v", err)
			}
			if a.NodeID != tc.wantNode {
				t.Fatalf("loaded %s, want %s", a.NodeID, tc.wantNode)
			}
			// Loading again gives the same (the swap was finished).
			if b, err := identity.Load(dir); err != nil || b.NodeID != tc.wantNode {
				t.Fatalf("second load: %v %v", b, err)
			}
		})
	}
}

func TestSaveRefusesCertificateForAnotherKey(t *testing.T) {
	k1, _ := issued(t, "node_a")
	_, c2 := issued(t, "node_b")
	if _, err := identity.Save(t.TempDir(), k1, c2, identity.Identity{NodeID: "node_a", Role: "node"}); err == nil {
		t.Fatal("Save stored a certificate for another key")
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	for _, tt := range []struct {
		data string
		mode os.FileMode
	}{{"one", 0o600}, {"two, longer", 0o644}} {
		if err := identity.WriteFileAtomic(p, []byte(tt.data), tt.mode); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		st, _ := os.Stat(p)
		if err != nil || string(b) != tt.data || st.Mode().Perm() != tt.mode {
			t.Errorf("file %q mode %v, want %q %v", b, st.Mode().Perm(), tt.data, tt.mode)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries, want only the file", len(ents))
	}
	if err := identity.WriteFileAtomic(filepath.Join(dir, "nodir", "f"), []byte("x"), 0o600); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

func TestReset(t *testing.T) {
	dir := t.TempDir()
	k, c := issued(t, "node_a")
	if _, err := identity.Save(dir, k, c, identity.Identity{NodeID: "node_a", Role: "node"}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"journal.db", "clock.json"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "journal"), 0o700); err != nil {
		t.Fatal(err)
	}
	wantMoved := []string{filepath.Join(dir, identity.IdentityFile), filepath.Join(dir, identity.KeyFile), filepath.Join(dir, "journal"), filepath.Join(dir, "journal.db")}
	sort.Strings(wantMoved)
	cand := identity.ResetCandidates(dir)
	sort.Strings(cand)
	if strings.Join(cand, "|") != strings.Join(wantMoved, "|") {
		t.Errorf("ResetCandidates = %v, want %v", cand, wantMoved)
	}
	now := time.Unix(1795000000, 0)
	moved, err := identity.Reset(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(moved)
	if strings.Join(moved, "|") != strings.Join(wantMoved, "|") {
		t.Errorf("Reset moved %v, want %v", moved, wantMoved)
	}
	for _, p := range wantMoved {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there: %v", p, err)
		}
		if _, err := os.Stat(p + ".reset-1795000000"); err != nil {
			t.Errorf("%s was not moved aside: %v", p, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "clock.json")); err != nil || string(b) != "clock.json" {
		t.Errorf("Reset touched clock.json: %q %v", b, err)
	}
	if _, err := identity.Load(dir); !errors.Is(err, identity.ErrNotJoined) {
		t.Errorf("Load after Reset: %v, want ErrNotJoined", err)
	}
	if len(identity.ResetCandidates(dir)) != 0 {
		t.Error("candidates remain after Reset")
	}
	if moved, err := identity.Reset(dir, now); err != nil || len(moved) != 0 {
		t.Errorf("second Reset: %v %v, want nothing moved", moved, err)
	}
}
