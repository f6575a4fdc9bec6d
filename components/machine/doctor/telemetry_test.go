package doctor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned is a certificate for 127.0.0.1 that no CA of the tests
// vouches for.
func selfSigned(t *testing.T) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writeSpec(t *testing.T, dir string, spec any) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"generation": 1, "spec": spec})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "spec.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTelemetryCheck: ok without a section and with a collector that
// takes a TLS connection under the spec's CA; warn when it is down or
// its certificate is not the spec's CA's.
func TestTelemetryCheck(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "https://" + ln.Addr().String()
	ln.Close()
	other := httptest.NewUnstartedServer(http.NotFoundHandler())
	other.TLS = &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}
	other.StartTLS()
	defer other.Close()
	tests := []struct {
		name   string
		spec   any
		status Status
		detail string
	}{
		{"no spec", nil, OK, "no desired state held yet"},
		{"no section", map[string]any{"fakehw": map[string]any{}}, OK, "no telemetry section"},
		{"reachable", map[string]any{"telemetry": map[string]any{"endpoint": srv.URL, "ca_pem": ca}}, OK, "takes a trusted TLS connection"},
		{"down", map[string]any{"telemetry": map[string]any{"endpoint": down, "ca_pem": ca}}, Warn, "is unreachable"},
		{"another CA", map[string]any{"telemetry": map[string]any{"endpoint": other.URL, "ca_pem": ca}}, Warn, "certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.spec != nil {
				writeSpec(t, dir, tt.spec)
			}
			r := Telemetry(dir).Run(context.Background())
			if r.Status != tt.status || !strings.Contains(r.Detail, tt.detail) {
				t.Fatalf("%+v, want %s with %q", r, tt.status, tt.detail)
			}
		})
	}
}
