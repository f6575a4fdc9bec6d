package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// tlsFixture holds a serving CA with a gateway leaf and a node CA.
type tlsFixture struct {
	servingCA *CA
	nodeCA    *CA
	otherCA   *CA
	serving   tls.Certificate
	pin       string
}

func newTLSFixture(t *testing.T) *tlsFixture {
	t.Helper()
	f := &tlsFixture{
		servingCA: mustCA(t, "serving"),
		nodeCA:    mustCA(t, "nodes"),
		otherCA:   mustCA(t, "other"),
	}
	k := mustKey(t)
	leaf, err := f.servingCA.IssueServer(k.Public(), []string{"gw.test"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f.serving = TLSCertificate(leaf, k, f.servingCA.Cert)
	f.pin = PinOfCert(f.servingCA.Cert)
	return f
}

func clientCert(t *testing.T, ca *CA, node string) *tls.Certificate {
	t.Helper()
	k := mustKey(t)
	c, err := ca.IssueClient(k.Public(), node, SPIFFEID("lab.example", "agent", node), "lab", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tc := TLSCertificate(c, k, ca.Cert)
	return &tc
}

type handshakeResult struct {
	clientErr   error
	serverErr   error
	clientState tls.ConnectionState
	serverState tls.ConnectionState
}

// handshake runs one TLS connection over loopback. After the handshake the
// client sends one byte that the server echoes, so failures the server
// detects after the client's handshake finishes (TLS 1.3 client
// certificates) reach the client.
func handshake(t *testing.T, server, client *tls.Config) handshakeResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	type srvOut struct {
		err   error
		state tls.ConnectionState
	}
	done := make(chan srvOut, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			done <- srvOut{err: err}
			return
		}
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
		conn := tls.Server(raw, server)
		if err := conn.HandshakeContext(ctx); err != nil {
			done <- srvOut{err: err}
			return
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(conn, buf); err != nil {
			done <- srvOut{err: err, state: conn.ConnectionState()}
			return
		}
		_, err = conn.Write(buf)
		done <- srvOut{err: err, state: conn.ConnectionState()}
	}()

	var res handshakeResult
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	conn := tls.Client(raw, client)
	res.clientErr = conn.HandshakeContext(ctx)
	if res.clientErr == nil {
		res.clientState = conn.ConnectionState()
		if _, err := conn.Write([]byte{'x'}); err != nil {
			res.clientErr = err
		} else {
			buf := make([]byte, 1)
			if _, err := io.ReadFull(conn, buf); err != nil {
				res.clientErr = err
			}
		}
	}
	raw.Close()
	out := <-done
	res.serverErr, res.serverState = out.err, out.state
	return res
}

func TestTLSHandshake(t *testing.T) {
	f := newTLSFixture(t)
	nodeCert := clientCert(t, f.nodeCA, "node-1")
	foreignCert := clientCert(t, f.otherCA, "node-x")

	// A leaf for gw.test signed by another CA, sent together with the real
	// serving CA certificate: the pin matches a presented certificate but the
	// leaf does not chain to it.
	forgedKey := mustKey(t)
	forgedLeaf, err := f.otherCA.IssueServer(forgedKey.Public(), []string{"gw.test"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	forged := TLSCertificate(forgedLeaf, forgedKey, f.servingCA.Cert)
	// The right leaf without the serving CA in the chain.
	leafOnly := f.serving
	leafOnly.Certificate = leafOnly.Certificate[:1]

	tests := []struct {
		name       string
		serving    tls.Certificate
		nodeCA     *x509.Certificate
		pin        string
		serverName string
		cert       *tls.Certificate
		tls12      bool
		clientErr  string // substring; "" means success
		serverFail bool
		wantPeer   bool // server saw a verified client certificate
	}{
		{name: "ok", serving: f.serving, nodeCA: f.nodeCA.Cert, pin: f.pin, serverName: "gw.test"},
		{name: "ok by ip", serving: f.serving, nodeCA: f.nodeCA.Cert, pin: f.pin, serverName: "127.0.0.1"},
		{name: "ok with client cert", serving: f.serving, nodeCA: f.nodeCA.Cert, pin: f.pin, serverName: "gw.test", cert: nodeCert, wantPeer: true},
		{name: "wrong pin", serving: f.serving, nodeCA: f.nodeCA.Cert, pin: PinOfCert(f.otherCA.Cert), serverName: "gw.test", clientErr: "gateway certificate does not chain to serving_ca_spki_pin", serverFail: true},
		{name: "leaf pin is not CA pin", serving: f.serving, nodeCA: f.nodeCA.Cert, pin: mustPin(t, mustKey(t).Public()), serverName: "gw.test", clientErr: "serving_ca_spki_pin", serverFail: true},
		{name: "wrong server name", serving: f.serving, nodeCA: f.nodeCA.Cert, pin: f.pin, serverName: "evil.test", clientErr: "evil.test", serverFail: true},
		{name: "forged leaf with real CA", serving: forged, nodeCA: f.nodeCA.Cert, pin: f.pin, serverName: "gw.test", clientErr: "serving_ca_spki_pin", serverFail: true},
		{name: "chain without CA", serving: leafOnly, nodeCA: f.nodeCA.Cert, pin: f.pin, serverName: "gw.test", clientErr: "gateway certificate does not chain to serving_ca_spki_pin", serverFail: true},
		{name: "client cert from other CA", serving: f.serving, nodeCA: f.nodeCA.Cert, pin: f.pin, serverName: "gw.test", cert: foreignCert, clientErr: "unknown certificate authority", serverFail: true},
		{name: "client cert with nil node CA", serving: f.serving, nodeCA: nil, pin: f.pin, serverName: "gw.test", cert: nodeCert, clientErr: "unknown certificate authority", serverFail: true},
		{name: "tls 1.2 client", serving: f.serving, nodeCA: f.nodeCA.Cert, pin: f.pin, serverName: "gw.test", tls12: true, clientErr: "protocol version", serverFail: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ccfg, err := ClientTLS(tc.pin, tc.serverName, tc.cert)
			if err != nil {
				t.Fatalf("ClientTLS: %v", err)
			}
			if tc.tls12 {
				ccfg.MinVersion, ccfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
			}
			res := handshake(t, ServerTLS(tc.serving, tc.nodeCA), ccfg)
			if tc.clientErr == "" {
				if res.clientErr != nil || res.serverErr != nil {
					t.Fatalf("client err %v, server err %v", res.clientErr, res.serverErr)
				}
				if res.clientState.Version != tls.VersionTLS13 {
					t.Fatalf("version %x, want TLS 1.3", res.clientState.Version)
				}
				if res.clientState.NegotiatedProtocol != "h2" {
					t.Fatalf("ALPN %q, want h2", res.clientState.NegotiatedProtocol)
				}
				gotPeer := len(res.serverState.VerifiedChains) > 0
				if gotPeer != tc.wantPeer {
					t.Fatalf("server verified client cert = %v, want %v", gotPeer, tc.wantPeer)
				}
				if tc.wantPeer {
					leaf := res.serverState.PeerCertificates[0]
					if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://lab.example/agent/node-1" {
						t.Fatalf("client URI SAN = %v", leaf.URIs)
					}
				}
				return
			}
			if res.clientErr == nil || !strings.Contains(res.clientErr.Error(), tc.clientErr) {
				t.Fatalf("client err = %v, want containing %q", res.clientErr, tc.clientErr)
			}
			if strings.Contains(res.clientErr.Error(), strings.TrimPrefix(tc.pin, "sha256/")) {
				t.Fatalf("client error echoes the pin: %v", res.clientErr)
			}
			if tc.serverFail && res.serverErr == nil {
				t.Fatal("server accepted the connection")
			}
		})
	}
}

func TestClientTLSConfig(t *testing.T) {
	f := newTLSFixture(t)
	tests := []struct {
		name       string
		pin        string
		serverName string
		cert       *tls.Certificate
		wantErr    string
	}{
		{name: "ok", pin: f.pin, serverName: "gw.test"},
		{name: "ok with cert", pin: f.pin, serverName: "gw.test", cert: clientCert(t, f.nodeCA, "n")},
		{name: "bad pin", pin: "sha256/abc", serverName: "gw.test", wantErr: "serving_ca_spki_pin"},
		{name: "empty pin", pin: "", serverName: "gw.test", wantErr: "serving_ca_spki_pin"},
		{name: "empty server name", pin: f.pin, serverName: "", wantErr: "server name"},
		{name: "empty cert", pin: f.pin, serverName: "gw.test", cert: &tls.Certificate{}, wantErr: "client certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ClientTLS(tc.pin, tc.serverName, tc.cert)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ClientTLS: %v", err)
			}
			if cfg.MinVersion != tls.VersionTLS13 || cfg.MaxVersion != tls.VersionTLS13 {
				t.Fatal("not TLS 1.3 only")
			}
			if cfg.RootCAs != nil || cfg.VerifyConnection == nil || !cfg.InsecureSkipVerify {
				t.Fatal("verification is not replaced by the pinned VerifyConnection")
			}
			if len(cfg.NextProtos) != 1 || cfg.NextProtos[0] != "h2" {
				t.Fatalf("NextProtos = %v", cfg.NextProtos)
			}
			if (cfg.GetClientCertificate != nil) != (tc.cert != nil) {
				t.Fatal("client certificate offering does not match input")
			}
			if err := cfg.VerifyConnection(tls.ConnectionState{}); err == nil {
				t.Fatal("empty peer chain accepted")
			}
		})
	}
}

func TestServerTLSConfig(t *testing.T) {
	f := newTLSFixture(t)
	cfg := ServerTLS(f.serving, f.nodeCA.Cert)
	if cfg.MinVersion != tls.VersionTLS13 || cfg.MaxVersion != tls.VersionTLS13 {
		t.Fatal("not TLS 1.3 only")
	}
	if cfg.ClientAuth != tls.VerifyClientCertIfGiven || cfg.ClientCAs == nil {
		t.Fatal("client auth is not VerifyClientCertIfGiven with a CA pool")
	}
	if len(cfg.Certificates) != 1 || len(cfg.Certificates[0].Certificate) != 2 {
		t.Fatal("server does not send leaf + serving CA")
	}
	if got := strings.Join(cfg.NextProtos, ","); got != "h2,http/1.1" {
		t.Fatalf("NextProtos = %q", got)
	}
	if nilCfg := ServerTLS(f.serving, nil); nilCfg.ClientCAs == nil {
		t.Fatal("nil node CA left ClientCAs nil (system roots)")
	}
}

func TestTLSCertificate(t *testing.T) {
	ca := mustCA(t, "c")
	k := mustKey(t)
	leaf, err := ca.IssueServer(k.Public(), []string{"gw.test"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		leaf  *x509.Certificate
		chain []*x509.Certificate
		want  int
	}{
		{name: "leaf only", leaf: leaf, want: 1},
		{name: "leaf and CA", leaf: leaf, chain: []*x509.Certificate{ca.Cert}, want: 2},
		{name: "nil entries skipped", leaf: leaf, chain: []*x509.Certificate{nil, ca.Cert}, want: 2},
		{name: "nil leaf", leaf: nil, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := TLSCertificate(tc.leaf, k, tc.chain...)
			if len(got.Certificate) != tc.want {
				t.Fatalf("%d certificates, want %d", len(got.Certificate), tc.want)
			}
			if got.PrivateKey != k || got.Leaf != tc.leaf {
				t.Fatal("key or leaf not kept")
			}
		})
	}
}
