package identity_test

import (
	"crypto"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

func openTPM(t *testing.T) *nodetpm.TPM {
	t.Helper()
	sw := swtpmtest.Start(t, "")
	tp, err := nodetpm.OpenTCP(sw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	return tp
}

func issuedFor(t *testing.T, key crypto.Signer, nodeID string) *identity.Agent {
	t.Helper()
	c, err := ca.IssueClient(key.Public(), nodeID, pki.SPIFFEID("bcgw.lab", "node", nodeID), "lab", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &identity.Agent{Key: key, Cert: c, Identity: identity.Identity{NodeID: nodeID, Role: "node"}}
}

// TestTPMKeyMoveCrashSafe: a renewal that moves a file key into the TPM
// (node.key.next is then a TPM record) leaves an identity that loads after
// a crash at each step, with the key holder of the certificate it names.
func TestTPMKeyMoveCrashSafe(t *testing.T) {
	tp := openTPM(t)
	tk, err := tp.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	next := issuedFor(t, tk, "node_b")
	// What Save writes for the TPM key, made in a scratch directory.
	scratch := t.TempDir()
	if _, err := identity.Save(scratch, tk, next.Cert, next.Identity); err != nil {
		t.Fatal(err)
	}
	rec, _ := os.ReadFile(filepath.Join(scratch, identity.KeyFile))
	idJSON, _ := os.ReadFile(filepath.Join(scratch, identity.IdentityFile))
	for _, tc := range []struct {
		name       string
		files      map[string][]byte
		wantNode   string
		wantHolder string
	}{
		{"after node.key.next", map[string][]byte{identity.KeyFile + ".next": rec}, "node_a", identity.KeyInFile},
		{"after identity.json", map[string][]byte{identity.KeyFile + ".next": rec, identity.IdentityFile: idJSON}, "node_b", identity.KeyInTPM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			k1, c1 := issued(t, "node_a")
			if _, err := identity.Save(dir, k1, c1, identity.Identity{NodeID: "node_a", Role: "node"}); err != nil {
				t.Fatal(err)
			}
			for n, b := range tc.files {
				if err := identity.WriteFileAtomic(filepath.Join(dir, n), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			a, err := identity.LoadWith(dir, tp)
			if err != nil || a.NodeID != tc.wantNode || a.KeyHolder != tc.wantHolder {
				t.Fatalf("after a crash: %v, node %v holder %v; want %s %s", err, a.NodeID, a.KeyHolder, tc.wantNode, tc.wantHolder)
			}
			if _, err := pki.Sign(a.Key, pki.PurposeRenew, []byte("m")); err != nil {
				t.Fatalf("the loaded key does not sign: %v", err)
			}
		})
	}
}

func TestTPMRecordRefused(t *testing.T) {
	tp := openTPM(t)
	tk, err := tp.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	a := issuedFor(t, tk, "node_a")
	dir := t.TempDir()
	if _, err := identity.Save(dir, tk, a.Cert, a.Identity); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(filepath.Join(dir, identity.KeyFile))
	// Another TPM key's record, and this record with the other's unique.
	ok2, _ := tp.NewNodeKey()
	o := issuedFor(t, ok2, "node_o")
	odir := t.TempDir()
	if _, err := identity.Save(odir, ok2, o.Cert, o.Identity); err != nil {
		t.Fatal(err)
	}
	other, _ := os.ReadFile(filepath.Join(odir, identity.KeyFile))
	var g, ot map[string]map[string]string
	if json.Unmarshal(good, &g) != nil || json.Unmarshal(other, &ot) != nil {
		t.Fatal("records are not JSON")
	}
	g["tpm"]["unique"] = ot["tpm"]["unique"]
	swapped, _ := json.Marshal(g)
	for _, tc := range []struct{ name, body, want string }{
		{"unknown field", `{"tpm":{"unique":"AAAA","public_key":"AAAA","x":1}}`, "unknown field"},
		{"short unique", `{"tpm":{"unique":"AAAA","public_key":"AAAA"}}`, "unique is 3 bytes"},
		{"no tpm object", `{}`, "no tpm object"},
		{"trailing data", strings.TrimSpace(string(good)) + `{}`, "trailing data"},
		{"not JSON", `{"tpm":`, "TPM key record"},
		{"bad public key", strings.Replace(string(good), `"public_key":"`, `"public_key":"AAAA`, 1), "public_key"},
		{"another key's record", string(other), "certificate is not for"},
		{"another key's unique", string(swapped), "the TPM derives another key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(dir, identity.KeyFile), []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := identity.LoadWith(dir, tp)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// FuzzLoadKeyRecord: whatever node.key holds, Load answers an identity or an
// error and never panics; a TPM record it accepts names the certificate's key.
func FuzzLoadKeyRecord(f *testing.F) {
	f.Add([]byte(`{"tpm":{"unique":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","public_key":"AAAA"}}`))
	f.Add([]byte(`{"tpm":null}`))
	f.Add([]byte(` {"tpm":{}}`))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"))
	k, c := issued(&testing.T{}, "node_f")
	dir := f.TempDir()
	if _, err := identity.Save(dir, k, c, identity.Identity{NodeID: "node_f", Role: "node"}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, identity.KeyFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(dir, identity.KeyFile+".next"))
		a, err := identity.Load(dir)
		if err == nil && !a.Cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(a.Key.Public()) {
			t.Fatal("loaded a key that is not the certificate's")
		}
	})
}
