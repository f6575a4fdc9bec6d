package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// authFront is a loopback https receiver in front of the collector that
// takes a post only with the one Authorization value and passes it on;
// the collector itself has no header check (its auth extensions are not
// in the core modules tools/otelcol builds).
type authFront struct {
	addr string
	mu   sync.Mutex
	ok   int      // posts with the right header, passed on
	bad  []string // what the refused posts carried (empty: no header)
}

func (f *authFront) counts() (int, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ok, append([]string(nil), f.bad...)
}

func startAuthFront(t *testing.T, collector, caPEM, certFile, keyFile, want string) *authFront {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(caPEM))
	up, _ := url.Parse("https://" + collector)
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	f := &authFront{}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("Authorization")
		f.mu.Lock()
		if got != want {
			f.bad = append(f.bad, got)
			f.mu.Unlock()
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		f.ok++
		f.mu.Unlock()
		rp.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return f
}

// TestTelemetryHeaderSecretThroughBcgw: a node's telemetry section names
// the header Authorization; until an operator sets its value in bcgw the
// section is RETRYING and nothing is posted. `bcgw secret set
// telemetry-header/Authorization --node N --value-file F` stores it; the
// node asks for it with a sealed SecretRequest, bcgw answers sealed, and
// the node's exports pass a front that takes only that value on to a real
// OpenTelemetry Collector, which prints bcd.gpu.* for the 8 GPUs. The
// value never appears in any process's output (the gateway's and the
// node's logs included), in any argv, in the desired spec (bcgw spec get,
// the node's spec.json), in bcgw status, or in clear in bcgw.db.
func TestTelemetryHeaderSecretThroughBcgw(t *testing.T) {
	col := otelcol(t)
	l := newLab(t)
	ca, certFile, keyFile := collectorTLS(t, l.root)
	colAddr := freeAddr(t)
	c := l.startCollector(col, colAddr, certFile, keyFile)
	const secret = "Bearer e2e-telemetry-s3cret-Q7x"
	front := startAuthFront(t, colAddr, ca, certFile, keyFile, secret)

	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	spec, _ := json.Marshal(map[string]any{"telemetry": map[string]any{
		"endpoint": "https://" + front.addr, "interval_s": 1, "ca_pem": ca, "headers": []string{"Authorization"},
	}})
	l.spec(g, "set", id, string(spec))
	st := l.waitStatus(g, id, "telemetry RETRYING without its header secret", func(s adminapi.StatusView) bool {
		return section(s, "telemetry").State == "RETRYING"
	})
	if msg := section(st, "telemetry").Message; !strings.Contains(msg, "bcgw secret set telemetry-header/Authorization") {
		t.Errorf("the RETRYING section does not say what to do: %q", msg)
	}
	if ok, bad := front.counts(); ok != 0 || len(bad) != 0 {
		t.Fatalf("posts without the secret: %d passed, %d refused", ok, len(bad))
	}

	vf := filepath.Join(l.root, "authorization")
	if err := os.WriteFile(vf, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := l.bcgw(g, "secret", "set", "telemetry-header/Authorization", "--node", id, "--value-file", vf); !strings.Contains(out, "set telemetry-header/Authorization for node "+id) {
		t.Fatalf("bcgw secret set: %q", out)
	}
	if err := os.Remove(vf); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if parseDebug(c.stderr.String()).gpus() >= 8 {
			break
		}
		if time.Now().After(end) {
			ok, bad := front.counts()
			t.Fatalf("the collector has no 8 GPUs within 90s of the secret (%d posts passed, %d refused); status %+v", ok, len(bad), section(l.gwStatus(g, id), "telemetry"))
		}
	}
	l.waitStatus(g, id, "telemetry CONVERGED", func(s adminapi.StatusView) bool { return section(s, "telemetry").State == "CONVERGED" })
	ok, bad := front.counts()
	if ok == 0 || len(bad) != 0 {
		t.Fatalf("the front passed %d posts and refused %d (%q)", ok, len(bad), bad)
	}

	// Where the value must not be.
	l.out.assertAbsent(t, "the telemetry header secret", secret)
	l.out.mu.Lock()
	for _, b := range l.out.all {
		if strings.Contains(b.name, "s3cret") { // a syncBuf is named after its process's argv
			t.Errorf("an argv holds the secret: %s", b.name)
		}
	}
	l.out.mu.Unlock()
	for what, s := range map[string]string{
		"bcgw spec get":    l.bcgw(g, "spec", "get", id),
		"bcgw status":      l.bcgw(g, "status", id, "--json"),
		"bcgw secret list": l.bcgw(g, "secret", "list", "--json"),
	} {
		if strings.Contains(s, "s3cret") {
			t.Errorf("%s shows the secret", what)
		}
	}
	for _, p := range []string{filepath.Join(l.root, "n", "data", "spec.json"), filepath.Join(g.dataDir, "bcgw.db")} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "s3cret") {
			t.Errorf("%s holds the secret in clear", p)
		}
	}
}
