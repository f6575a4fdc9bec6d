package pki

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

func mustCA(t testing.TB, cn string) *CA {
	t.Helper()
	ca, err := NewCA(cn, 24*time.Hour)
	if err != nil {
		t.Fatalf("NewCA: %v", err)
	}
	return ca
}

func TestNewCA(t *testing.T) {
	tests := []struct {
		name     string
		validity time.Duration
		wantErr  string
	}{
		{name: "day", validity: 24 * time.Hour},
		{name: "zero", validity: 0, wantErr: "validity"},
		{name: "negative", validity: -time.Hour, wantErr: "validity"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ca, err := NewCA("bcd serving CA", tc.validity)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewCA: %v", err)
			}
			c := ca.Cert
			if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero {
				t.Fatalf("CA constraints: IsCA=%v valid=%v maxPathLen=%d zero=%v", c.IsCA, c.BasicConstraintsValid, c.MaxPathLen, c.MaxPathLenZero)
			}
			if c.KeyUsage&x509.KeyUsageCertSign == 0 {
				t.Fatal("CA lacks KeyUsageCertSign")
			}
			if c.Subject.CommonName != "bcd serving CA" {
				t.Fatalf("CN = %q", c.Subject.CommonName)
			}
			if err := c.CheckSignatureFrom(c); err != nil {
				t.Fatalf("not self-signed: %v", err)
			}
			if d := c.NotAfter.Sub(c.NotBefore); d < tc.validity || d > tc.validity+2*time.Minute {
				t.Fatalf("validity span %v, want about %v", d, tc.validity)
			}
		})
	}
}

func TestLoadCA(t *testing.T) {
	ca := mustCA(t, "load")
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatalf("KeyPEM: %v", err)
	}
	otherKeyPEM, err := MarshalPrivateKeyPEM(mustKey(t))
	if err != nil {
		t.Fatal(err)
	}
	leafKey := mustKey(t)
	leaf, err := ca.IssueServer(leafKey.Public(), []string{"gw.test"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leafKeyPEM, err := MarshalPrivateKeyPEM(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cert    []byte
		key     []byte
		wantErr string
	}{
		{name: "valid", cert: ca.CertPEM(), key: keyPEM},
		{name: "mismatched key", cert: ca.CertPEM(), key: otherKeyPEM, wantErr: "does not match"},
		{name: "leaf cert", cert: CertPEM(leaf), key: leafKeyPEM, wantErr: "not a CA"},
		{name: "no cert", cert: nil, key: keyPEM, wantErr: "no PEM block"},
		{name: "key as cert", cert: keyPEM, key: keyPEM, wantErr: `"PRIVATE KEY"`},
		{name: "garbage cert der", cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), key: keyPEM, wantErr: "load CA certificate"},
		{name: "bad key", cert: ca.CertPEM(), key: []byte("nope"), wantErr: "load CA key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadCA(tc.cert, tc.key)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadCA: %v", err)
			}
			if !got.Cert.Equal(ca.Cert) {
				t.Fatal("loaded certificate differs")
			}
			// The loaded CA must be able to issue.
			if _, err := got.IssueServer(mustKey(t).Public(), []string{"gw.test"}, nil, time.Hour); err != nil {
				t.Fatalf("issue with loaded CA: %v", err)
			}
		})
	}
}

func TestParseCertPEM(t *testing.T) {
	a, b := mustCA(t, "a"), mustCA(t, "b")
	both := append(a.CertPEM(), b.CertPEM()...)
	key, err := a.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		in      []byte
		want    int
		wantErr string
	}{
		{name: "one", in: a.CertPEM(), want: 1},
		{name: "two", in: both, want: 2},
		{name: "empty", in: nil, wantErr: "no certificate"},
		{name: "key block", in: append(a.CertPEM(), key...), wantErr: `"PRIVATE KEY"`},
		{name: "trailing junk", in: append(a.CertPEM(), "junk"...), wantErr: "trailing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCertPEM(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != tc.want {
				t.Fatalf("got %d certs, err %v; want %d", len(got), err, tc.want)
			}
		})
	}
}

func TestIssueServer(t *testing.T) {
	ca := mustCA(t, "serving")
	pub := mustKey(t).Public()
	tests := []struct {
		name     string
		ca       *CA
		pub      crypto.PublicKey
		dns      []string
		ips      []net.IP
		validity time.Duration
		wantErr  string
	}{
		{name: "dns and ip", ca: ca, pub: pub, dns: []string{"gw.test"}, ips: []net.IP{net.IPv4(127, 0, 0, 1)}, validity: time.Hour},
		{name: "ip only", ca: ca, pub: pub, ips: []net.IP{net.IPv6loopback}, validity: time.Hour},
		{name: "clamped to CA", ca: ca, pub: pub, dns: []string{"gw.test"}, validity: 1000 * time.Hour},
		{name: "no names", ca: ca, pub: pub, validity: time.Hour, wantErr: "no DNS names"},
		{name: "zero validity", ca: ca, pub: pub, dns: []string{"gw.test"}, wantErr: "validity"},
		{name: "p384 key", ca: ca, pub: mustP384(t).Public(), dns: []string{"gw.test"}, validity: time.Hour, wantErr: "P-384"},
		{name: "nil key", ca: ca, pub: nil, dns: []string{"gw.test"}, validity: time.Hour, wantErr: "want ECDSA P-256"},
		{name: "empty CA", ca: &CA{}, pub: pub, dns: []string{"gw.test"}, validity: time.Hour, wantErr: "not loaded"},
		{name: "nil CA", ca: nil, pub: pub, dns: []string{"gw.test"}, validity: time.Hour, wantErr: "not loaded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.ca.IssueServer(tc.pub, tc.dns, tc.ips, tc.validity)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("IssueServer: %v", err)
			}
			if c.IsCA {
				t.Fatal("server certificate is a CA")
			}
			if c.NotAfter.After(ca.Cert.NotAfter) {
				t.Fatal("NotAfter exceeds the CA's")
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca.Cert)
			name := ""
			if len(tc.dns) > 0 {
				name = tc.dns[0]
			} else {
				name = tc.ips[0].String()
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				t.Fatalf("verify as server: %v", err)
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
				t.Fatal("server certificate verified for client auth")
			}
		})
	}
}

func TestIssueClient(t *testing.T) {
	ca := mustCA(t, "node")
	pub := mustKey(t).Public()
	id := SPIFFEID("lab.example", "agent", "node-1")
	tests := []struct {
		name     string
		id       *url.URL
		org      string
		validity time.Duration
		wantErr  string
	}{
		{name: "with org", id: id, org: "lab-a", validity: time.Hour},
		{name: "no org", id: id, validity: time.Hour},
		{name: "nil id", id: nil, validity: time.Hour, wantErr: "nil URL"},
		{name: "bad id", id: SPIFFEID("lab.example", "agent", "a/b"), validity: time.Hour, wantErr: "path"},
		{name: "https id", id: &url.URL{Scheme: "https", Host: "lab.example", Path: "/agent/n"}, validity: time.Hour, wantErr: "scheme"},
		{name: "zero validity", id: id, wantErr: "validity"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := time.Now()
			c, err := ca.IssueClient(pub, "node-1", tc.id, tc.org, tc.validity)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("IssueClient: %v", err)
			}
			if len(c.URIs) != 1 || c.URIs[0].String() != tc.id.String() {
				t.Fatalf("URIs = %v, want [%v]", c.URIs, tc.id)
			}
			if tc.org == "" && len(c.Subject.OrganizationalUnit) != 0 {
				t.Fatalf("OU = %v, want none", c.Subject.OrganizationalUnit)
			}
			if tc.org != "" && (len(c.Subject.OrganizationalUnit) != 1 || c.Subject.OrganizationalUnit[0] != tc.org) {
				t.Fatalf("OU = %v, want [%s]", c.Subject.OrganizationalUnit, tc.org)
			}
			if c.Subject.CommonName != "node-1" {
				t.Fatalf("CN = %q", c.Subject.CommonName)
			}
			if nb := before.Add(-time.Minute).Truncate(time.Second); c.NotBefore.Before(nb.Add(-time.Second)) || c.NotBefore.After(before.Add(-time.Minute+time.Second)) {
				t.Fatalf("NotBefore = %v, want about %v", c.NotBefore, before.Add(-time.Minute))
			}
			if c.SerialNumber.Sign() <= 0 || c.SerialNumber.BitLen() > 128 {
				t.Fatalf("serial %v not in (0, 2^128)", c.SerialNumber)
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca.Cert)
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Fatalf("verify as client: %v", err)
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
				t.Fatal("client certificate verified for server auth")
			}
		})
	}

	a, err := ca.IssueClient(pub, "n", id, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ca.IssueClient(pub, "n", id, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if a.SerialNumber.Cmp(b.SerialNumber) == 0 {
		t.Fatal("two certificates share a serial number")
	}
}

func TestCAPEMNil(t *testing.T) {
	var ca *CA
	if ca.CertPEM() != nil {
		t.Fatal("CertPEM of nil CA is not nil")
	}
	if _, err := ca.KeyPEM(); err == nil {
		t.Fatal("KeyPEM of nil CA succeeded")
	}
}
