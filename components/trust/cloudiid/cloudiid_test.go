package cloudiid

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOnEC2 reads a fake sysfs tree per case.
func TestOnEC2(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		want  string // "" on EC2, else part of the reason
	}{
		{"nitro", map[string]string{"class/dmi/id/sys_vendor": "Amazon EC2\n"}, ""},
		{"xen with EC2's BIOS", map[string]string{"class/dmi/id/sys_vendor": "Xen\n", "class/dmi/id/bios_version": "4.11.amazon\n"}, ""},
		{"xen with an ec2 UUID", map[string]string{"class/dmi/id/sys_vendor": "Xen\n", "hypervisor/uuid": "ec2e1916-9099-7caf-fd21-012345abcdef\n"}, ""},
		{"xen with an EC2 product UUID", map[string]string{"class/dmi/id/sys_vendor": "Xen\n", "class/dmi/id/product_uuid": "EC2E1916-9099-7CAF\n"}, ""},
		{"another xen", map[string]string{"class/dmi/id/sys_vendor": "Xen\n", "class/dmi/id/bios_version": "4.2\n"}, "neither its BIOS version nor its UUID"},
		{"qemu", map[string]string{"class/dmi/id/sys_vendor": "QEMU\n"}, `sys_vendor is "QEMU"`},
		{"no DMI", nil, "no DMI sys_vendor"},
	} {
		root := t.TempDir()
		for p, v := range c.files {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, p), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		err := OnEC2(root)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

func standIn(t *testing.T) (*rsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "aws"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return k, c
}

func sign(t *testing.T, k *rsa.PrivateKey, doc []byte) []byte {
	sum := sha256.Sum256(doc)
	sig, err := rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	// IMDS wraps the base64 at 76 columns.
	b := base64.StdEncoding.EncodeToString(sig)
	return []byte(b[:76] + "\n" + b[76:])
}

// TestVerify: a document verifies only under a pinned certificate, with
// its exact bytes, and must name its account, instance and region.
func TestVerify(t *testing.T) {
	k, c := standIn(t)
	other, _ := standIn(t)
	doc := []byte(`{"accountId": "123456789012", "instanceId": "i-0abc", "region": "us-east-1", "pendingTime": "2026-01-02T03:04:05Z"}`)
	d, err := Verify(Evidence{Document: doc, Signature: sign(t, k, doc)}, []*x509.Certificate{c})
	if err != nil || d.AccountID != "123456789012" || d.InstanceID != "i-0abc" || d.Region != "us-east-1" || d.PendingTime.Year() != 2026 {
		t.Fatalf("a good document: %+v %v", d, err)
	}
	noAccount := []byte(`{"instanceId": "i-0abc", "region": "us-east-1"}`)
	for _, tc := range []struct {
		name string
		ev   Evidence
		want string
	}{
		{"another key", Evidence{Document: doc, Signature: sign(t, other, doc)}, "does not verify"},
		{"a changed document", Evidence{Document: append([]byte(" "), doc...), Signature: sign(t, k, doc)}, "does not verify"},
		{"not base64", Evidence{Document: doc, Signature: []byte("!!")}, "not base64"},
		{"empty", Evidence{}, "empty or too large"},
		{"no account", Evidence{Document: noAccount, Signature: sign(t, k, noAccount)}, "names no account"},
	} {
		if _, err := Verify(tc.ev, []*x509.Certificate{c}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// FuzzVerify: whatever a node sends as its document never panics the
// gateway.
func FuzzVerify(f *testing.F) {
	f.Add([]byte(`{"accountId":"1","instanceId":"i","region":"r"}`), []byte("AAAA"))
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		f.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	c, _ := x509.ParseCertificate(der)
	f.Fuzz(func(t *testing.T, doc, sig []byte) {
		_, _ = Verify(Evidence{Document: doc, Signature: sig}, []*x509.Certificate{c})
		_, _ = ParseCerts(doc)
	})
}
