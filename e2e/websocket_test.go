package e2e

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
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// proxyTLS is a TLS-terminating proxy's own CA and certificate for
// 127.0.0.1, as an enterprise proxy has: the node trusts the CA through
// [websocket] ca_file and never sees the gateway's serving certificate.
type proxyTLS struct {
	caFile  string          // the CA, PEM
	pemFile string          // certificate and key, PEM, for haproxy's crt
	cert    tls.Certificate // the same, for a Go proxy
}

func (l *lab) proxyTLS() proxyTLS {
	l.t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test proxy CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	if err != nil {
		l.t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lt := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, lt, ca, &key.PublicKey, caKey)
	if err != nil {
		l.t.Fatal(err)
	}
	kd, _ := x509.MarshalPKCS8PrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd})
	p := proxyTLS{caFile: filepath.Join(l.root, "proxy-ca.pem"), pemFile: filepath.Join(l.root, "proxy.pem")}
	if err := os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(p.pemFile, append(certPEM, keyPEM...), 0o600); err != nil {
		l.t.Fatal(err)
	}
	if p.cert, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		l.t.Fatal(err)
	}
	return p
}

// wsHAProxyConfig is HAProxy in HTTP mode terminating TLS with the
// proxy's own certificate, asking no client certificate and presenting
// none to the gateway (so none reaches bcgw), and forwarding HTTP/1.1,
// WebSocket upgrades included, to bcgw over TLS.
func wsHAProxyConfig(listen, pemFile, gateway string) string {
	return fmt.Sprintf(`global
    maxconn 256

defaults
    mode http
    timeout connect 2s
    timeout client 10m
    timeout server 10m
    timeout tunnel 10m

frontend agents
    bind %s ssl crt %s alpn http/1.1
    default_backend gateway

backend gateway
    server gw1 %s ssl verify none alpn http/1.1
`, listen, pemFile, gateway)
}

// startWSHAProxy runs haproxy with wsHAProxyConfig until the test ends.
func (l *lab) startWSHAProxy(listen, pemFile, gateway string) *proc {
	l.t.Helper()
	bin := testenv.NeedTool(l.t, "haproxy", "haproxy")
	cfg := filepath.Join(l.root, "haproxy-ws.cfg")
	if err := os.WriteFile(cfg, []byte(wsHAProxyConfig(listen, pemFile, gateway)), 0o600); err != nil {
		l.t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", cfg).CombinedOutput(); err != nil {
		l.t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-db", "-f", cfg)
	se := &syncBuf{name: "haproxy (stderr)"}
	l.out.add(se)
	cmd.Stdout, cmd.Stderr = se, se
	if err := cmd.Start(); err != nil {
		l.t.Fatalf("start haproxy: %v", err)
	}
	p := &proc{cmd: cmd, stderr: se, stdout: se, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	l.t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.done })
	for end := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			c.Close()
			return p
		}
		if time.Now().After(end) {
			l.t.Fatalf("haproxy does not accept on %s: %v\n%s", listen, err, se.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wsConfig writes a node's config.toml whose gateway nothing answers at,
// with [websocket] url at proxy, and join-encryption.jwk beside it.
func (l *lab) wsConfig(g *gw, name, proxy, caFile string) string {
	l.t.Helper()
	var doc struct {
		Gateway struct{ URL, ServerName string }
		Pins    struct{ ServingCa, JoinSigning, JoinEncryption string }
		Join    struct {
			EncryptionJwk json.RawMessage `json:"encryptionJwk"`
		}
	}
	if err := json.Unmarshal([]byte(l.bcgw(g, "well-known")), &doc); err != nil {
		l.t.Fatal(err)
	}
	dir := filepath.Join(l.root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		l.t.Fatal(err)
	}
	cfg := fmt.Sprintf(`gateway = "https://%s"
serving_ca_spki_pin = %q
join_signing_key_pin = %q
join_encryption_key_pin = %q
data_dir = %q
socket_path = %q

[websocket]
url = "wss://%s/v1/session"
ca_file = %q
`, freeAddr(l.t), doc.Pins.ServingCa, doc.Pins.JoinSigning, doc.Pins.JoinEncryption, filepath.Join(dir, "data"),
		filepath.Join(dir, "run", "bcd.sock"), proxy, caFile)
	p := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "join-encryption.jwk"), doc.Join.EncryptionJwk, 0o644); err != nil {
		l.t.Fatal(err)
	}
	return p
}

// wsJoin joins the node of cfg with a new token, over the fallback.
func (l *lab) wsJoin(g *gw, cfg string) string {
	l.t.Helper()
	code, out, errOut := l.run(l.token(g, "--uses", "1")+"\n", nil, "bcd-node", "join", "--config", cfg)
	if code != 0 {
		l.t.Fatalf("bcd join over the WebSocket fallback: exit %d\n%s\n%s", code, out, errOut)
	}
	m := joinedRe.FindStringSubmatch(out)
	if m == nil {
		l.t.Fatalf("bcd join printed %q", out)
	}
	return m[1]
}

// TestWebSocketThroughHAProxy: behind HAProxy in HTTP mode, which
// terminates TLS with its own certificate and passes no client
// certificate on, a fakehw node whose gateway URL answers nothing and
// whose [websocket] url is the proxy joins, runs a command, takes a spec,
// renews its certificate (and reconnects with the new one), refuses a
// tunnel; then, with the proxy killed at random points while commands
// with a side effect run, bcgw too every second trial and the node every
// third (each restarted on its address or data directory), no side effect
// happens twice and every command has its one result.
func TestWebSocketThroughHAProxy(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0")
	pt := l.proxyTLS()
	proxyAddr := freeAddr(t)
	hp := l.startWSHAProxy(proxyAddr, pt.pemFile, g.addr)
	cfg := l.wsConfig(g, "n", proxyAddr, pt.caFile)
	id := l.wsJoin(g, cfg)

	keyPath := filepath.Join(filepath.Dir(cfg), "data", "node.key")
	key1, _ := os.ReadFile(keyPath)
	node := l.startEnv([]string{"BCD_RENEW_AFTER=2s"}, "bcd-node", "node", "--config", cfg)
	node.waitLog(t, "using the WebSocket fallback: no tunnels", 10*time.Second)
	l.waitNode(g, id, "connected over the fallback", func(n nodeView) bool { return n.Connected })
	if !strings.Contains(g.stderr.String(), `"transport":"websocket"`) {
		t.Fatal("bcgw logged no session over the WebSocket fallback")
	}
	if code, out, _ := l.run("", nil, "bcd-node", "status", "--config", cfg); code != 0 || !strings.Contains(out, "wss://"+proxyAddr+"/v1/session") {
		t.Fatalf("bcd status on the fallback: exit %d\n%s", code, out)
	}
	if code, out, errOut := l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", gwDir); code != 0 || !strings.Contains(out, id) {
		t.Fatalf("agent.ping over the fallback: exit %d %s %s", code, out, errOut)
	}
	gen := l.spec(g, "set", id, `{"fakehw":{"files":{"a":"1"}}}`)
	l.waitStatus(g, id, "observed the spec over the fallback", func(s adminapi.StatusView) bool { return s.ObservedGeneration == gen })
	node.waitLog(t, "certificate renewed", 30*time.Second)
	n := l.waitNode(g, id, "reconnected after the renewal", func(n nodeView) bool { return n.Connected && n.Epoch >= 2 })
	if key2, _ := os.ReadFile(keyPath); string(key1) == string(key2) {
		t.Fatal("the renewal over the fallback stored no new key")
	}
	t.Logf("renewed over POST /v1/renew; epoch %d", n.Epoch)
	if code, _, errOut := l.run("", nil, "bcgw", "tunnel", id, "--ssh", "--data-dir", gwDir); code == 0 || !strings.Contains(errOut, "WebSocket fallback, which carries no tunnels") {
		t.Fatalf("a tunnel to a node on the fallback: exit %d: %s", code, errOut)
	}

	// The kill test over the fallback.
	marks := filepath.Join(filepath.Dir(cfg), "data", "fakehw", "marks.log")
	admin := adminapi.NewClient(gwDir, "", "")
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 2))
	var all []string
	const trials = 6
	for trial := range trials {
		for range 3 {
			c, err := admin.Send(ctx, adminapi.CommandRequest{Node: id, Kind: "fakehw.mark", Body: json.RawMessage(fmt.Sprintf(`{"sleep_ms":%d}`, rng.IntN(150)))})
			if err != nil {
				t.Fatalf("trial %d: send: %v", trial, err)
			}
			all = append(all, c.ID)
		}
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
		hp.signal(syscall.SIGKILL)
		hp.wait(t, 10*time.Second)
		if trial%3 == 2 {
			node.signal(syscall.SIGKILL)
			node.wait(t, 10*time.Second)
			node = l.start("bcd-node", "node", "--config", cfg)
		}
		if trial%2 == 1 {
			g.signal(syscall.SIGKILL)
			g.wait(t, 10*time.Second)
			g = l.startGateway(gwDir, g.addr)
			admin = adminapi.NewClient(gwDir, "", "")
		}
		checkMarks(t, marks, trial)
		hp = l.startWSHAProxy(proxyAddr, pt.pemFile, g.addr)
	}
	end := time.Now().Add(2 * time.Minute)
	statuses := map[string]int{}
	for _, cid := range all {
		var c adminapi.CommandView
		for {
			var err error
			if c, err = admin.Command(ctx, cid, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if c.State == "done" || time.Now().After(end) {
				break
			}
		}
		if c.State != "done" || c.Status != "SUCCEEDED" && c.Status != "INTERRUPTED" {
			t.Fatalf("command %s: %s %s %s", cid, c.State, c.Status, c.Error)
		}
		statuses[c.Status]++
	}
	counts := checkMarks(t, marks, trials)
	for _, cid := range all {
		if c, _ := admin.Command(ctx, cid, 0); c.Status == "SUCCEEDED" && counts[cid] != 1 {
			t.Errorf("command %s SUCCEEDED but its side effect happened %d times", cid, counts[cid])
		}
	}
	t.Logf("%d trials, %d commands through killed proxies, gateways and nodes: %v, no side effect twice", trials, len(all), statuses)
}

// TestWebSocketNeedsRoots: with a trust bundle that names no
// command-signing root (bcgw --command-key none), a node on the fallback
// joins and reaches the gateway but ends every session after Welcome with
// the line that says why, and a command sent to it does not run.
func TestWebSocketNeedsRoots(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0", "--command-key", "none")
	pt := l.proxyTLS()
	proxyAddr := freeAddr(t)
	l.startWSHAProxy(proxyAddr, pt.pemFile, g.addr)
	cfg := l.wsConfig(g, "n", proxyAddr, pt.caFile)
	id := l.wsJoin(g, cfg)
	node := l.start("bcd-node", "node", "--config", cfg)
	m := node.waitLog(t, "WebSocket fallback refused: the trust bundle names no command-signing roots, so the proxy in the middle could inject commands; add one (bcgw trust add-root) or reach the gateway directly", 30*time.Second)
	t.Logf("the node says: %v", m["msg"])
	c, err := adminapi.NewClient(gwDir, "", "").Send(context.Background(), adminapi.CommandRequest{Node: id, Kind: "fakehw.mark"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if v, _ := adminapi.NewClient(gwDir, "", "").Command(context.Background(), c.ID, 0); v.State != "pending" {
		t.Fatalf("a command to a node that refuses the fallback: %+v", v)
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(cfg), "data", "fakehw", "marks.log")); len(b) > 0 {
		t.Fatalf("a command ran: %s", b)
	}
}

// tamperProxy is the test's own TLS-terminating proxy: it relays the
// fallback's session message by message, and HTTP (join, challenge,
// renew) as it is, to bcgw; rewrite may change a gateway frame in flight.
type tamperProxy struct {
	addr    string
	mu      sync.Mutex
	rewrite func(*bcdv1.GatewayFrame) bool // true: the frame was changed
	changed int
}

func (l *lab) startTamperProxy(pt proxyTLS, gateway string, rewrite func(*bcdv1.GatewayFrame) bool) *tamperProxy {
	l.t.Helper()
	tp := &tamperProxy{rewrite: rewrite}
	up := &url.URL{Scheme: "https", Host: gateway}
	upTLS := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}} // as haproxy's verify none
	var protos http.Protocols
	protos.SetHTTP1(true)
	upClient := &http.Client{Transport: &http.Transport{TLSClientConfig: upTLS, Protocols: &protos}}
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.Transport = upClient.Transport
	mux := http.NewServeMux()
	mux.Handle("/", rp)
	mux.HandleFunc("GET /v1/session", func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		down, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer down.CloseNow()
		upc, _, err := websocket.Dial(ctx, "wss://"+gateway+"/v1/session?"+r.URL.RawQuery, &websocket.DialOptions{HTTPClient: upClient})
		if err != nil {
			return
		}
		defer upc.CloseNow()
		down.SetReadLimit(8 << 20)
		upc.SetReadLimit(8 << 20)
		done := make(chan struct{}, 2)
		go func() { // agent -> gateway, as it is
			defer func() { done <- struct{}{} }()
			for {
				typ, b, err := down.Read(ctx)
				if err != nil || upc.Write(ctx, typ, b) != nil {
					return
				}
			}
		}()
		go func() { // gateway -> agent, frames rewritten
			defer func() { done <- struct{}{} }()
			for {
				typ, b, err := upc.Read(ctx)
				if err != nil {
					return
				}
				if typ == websocket.MessageBinary {
					var f bcdv1.GatewayFrame
					if proto.Unmarshal(b, &f) == nil {
						tp.mu.Lock()
						if tp.rewrite(&f) {
							tp.changed++
							b, _ = proto.Marshal(&f)
						}
						tp.mu.Unlock()
					}
				}
				if down.Write(ctx, typ, b) != nil {
					return
				}
			}
		}()
		<-done
	})
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pt.cert}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		l.t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	l.t.Cleanup(func() { srv.Close() })
	tp.addr = ln.Addr().String()
	return tp
}

// TestWebSocketTamperingProxyCaught: a proxy in the middle that rewrites
// a command's body, or strips its signature, in flight is caught: the
// node refuses the command as BAD_SIGNATURE or UNSIGNED and its side
// effect never happens; an untouched command runs.
func TestWebSocketTamperingProxyCaught(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0")
	pt := l.proxyTLS()
	tp := l.startTamperProxy(pt, g.addr, func(f *bcdv1.GatewayFrame) bool {
		c := f.GetCommand()
		if c == nil || c.GetKind() != "fakehw.mark" {
			return false
		}
		switch string(c.GetBody()) {
		case `{"sleep_ms":1}`:
			c.Body = []byte(`{"sleep_ms":2}`) // rewritten
			return true
		case `{"sleep_ms":3}`:
			c.Signature = nil // stripped
			return true
		}
		return false
	})
	cfg := l.wsConfig(g, "n", tp.addr, pt.caFile)
	id := l.wsJoin(g, cfg)
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected through the tampering proxy", func(n nodeView) bool { return n.Connected })
	admin := adminapi.NewClient(gwDir, "", "")
	ctx := context.Background()
	for _, c := range []struct{ body, want string }{
		{`{"sleep_ms":1}`, "BAD_SIGNATURE"},
		{`{"sleep_ms":3}`, "UNSIGNED"},
		{`{"sleep_ms":5}`, "SUCCEEDED"},
	} {
		sent, err := admin.Send(ctx, adminapi.CommandRequest{Node: id, Kind: "fakehw.mark", Body: json.RawMessage(c.body)})
		if err != nil {
			t.Fatal(err)
		}
		v, err := admin.Command(ctx, sent.ID, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if v.Status != c.want {
			t.Errorf("command with body %s through the tampering proxy: %s %s, want %s", c.body, v.Status, v.Error, c.want)
		}
		counts := checkMarks(t, filepath.Join(filepath.Dir(cfg), "data", "fakehw", "marks.log"), 0)
		if ran := counts[sent.ID]; (c.want == "SUCCEEDED") != (ran == 1) {
			t.Errorf("command with body %s: its side effect happened %d times", c.body, ran)
		}
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if tp.changed < 2 {
		t.Fatalf("the proxy changed %d frames", tp.changed)
	}
}
