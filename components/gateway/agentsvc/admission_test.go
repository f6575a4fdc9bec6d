package agentsvc

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// selfSigned returns a server TLS config and a client config trusting it.
func selfSigned(t *testing.T) (*tls.Config, *tls.Config) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "admission.test"},
		DNSNames: []string{"admission.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: k}}, MinVersion: tls.VersionTLS13},
		&tls.Config{RootCAs: pool, ServerName: "admission.test", MinVersion: tls.VersionTLS13}
}

// TestHandshakeAdmission: with one handshake slot, a client that holds it
// (connected, silent) makes the next one wait; a connection that waited
// longer than the queue allows is closed without a handshake; once the
// slot is free, a client's handshake completes and Accept returns it.
func TestHandshakeAdmission(t *testing.T) {
	srvCfg, cliCfg := selfSigned(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int32
	h := NewHandshakeListener(ln, srvCfg, 1, slog.New(slog.DiscardHandler), func() { refused.Add(1) })
	defer h.Close()
	h.maxWait, h.timeout = 300*time.Millisecond, 2*time.Second
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := h.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	// The silent client takes the only slot for up to h.timeout.
	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	time.Sleep(100 * time.Millisecond)

	// A real client waits past maxWait and is closed unanswered.
	start := time.Now()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cliCfg)
	if err == nil {
		c.Close()
		t.Fatal("a handshake completed while the only slot was held")
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("the queued connection was closed after %s, want about 300ms", d)
	}
	if refused.Load() != 1 {
		t.Fatalf("%d connections closed for waiting, want 1", refused.Load())
	}

	// The silent client's handshake times out; the slot is free again.
	time.Sleep(2 * time.Second)
	c, err = tls.Dial("tcp", ln.Addr().String(), cliCfg)
	if err != nil {
		t.Fatalf("handshake with a free slot: %v", err)
	}
	defer c.Close()
	select {
	case sc := <-accepted:
		if !sc.(*tls.Conn).ConnectionState().HandshakeComplete {
			t.Fatal("Accept returned a connection before its handshake")
		}
		sc.Close()
	case <-time.After(2 * time.Second):
		t.Fatal("Accept did not return the connection")
	}
}
