package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
)

// haproxyConfig is build/haproxy.cfg, the configuration docs/gateway-store.md
// shows and build/demo-ha.sh runs, filled in: TCP mode, TLS passed
// through to the gateways (each terminates it with the serving
// certificate the fleet shares), a health check every second on each
// gateway's plain-HTTP GET /readyz (bcgw serve --health; 503 when its
// database does not answer, or it is shutting down), sessions left to
// drain when a gateway is marked down, and a connection that fails to
// reach a gateway sent to another.
func haproxyConfig(t testing.TB, maxconn int, listen string, gateways, health []string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "build", "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	return renderHAProxy(string(b), maxconn, listen, gateways, health)
}

// renderHAProxy fills in build/haproxy.cfg: gateway i is "server gwI+1
// gateways[i] check port PORT-OF-health[i]".
func renderHAProxy(tmpl string, maxconn int, listen string, gateways, health []string) string {
	var servers []string
	for i, g := range gateways {
		_, port, _ := net.SplitHostPort(health[i])
		servers = append(servers, fmt.Sprintf("    server gw%d %s check port %s", i+1, g, port))
	}
	r := strings.NewReplacer("@MAXCONN@", strconv.Itoa(maxconn), "@BIND@", listen, "@SERVERS@", strings.Join(servers, "\n"))
	return r.Replace(tmpl)
}

// TestHAProxyConfigIsDocumented: the configuration docs/gateway-store.md
// shows is build/haproxy.cfg (which the tests and make demo-ha run),
// filled in with the page's example addresses, word for word.
func TestHAProxyConfigIsDocumented(t *testing.T) {
	tmpl, err := os.ReadFile(filepath.Join("..", "build", "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "gateway-store.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := renderHAProxy(string(tmpl), 20000, ":8443", []string{"10.0.0.11:8443", "10.0.0.12:8443"}, []string{"10.0.0.11:8081", "10.0.0.12:8081"})
	// The page shows it under the file's place, without the template's
	// own header comment.
	_, body, ok := strings.Cut(want, "\nglobal\n")
	if !ok {
		t.Fatal("build/haproxy.cfg has no global section")
	}
	block := "```\n# /etc/haproxy/haproxy.cfg\nglobal\n" + body + "```\n"
	if !strings.Contains(string(doc), block) {
		t.Errorf("docs/gateway-store.md does not show build/haproxy.cfg as it is; want this block:\n%s", block)
	}
	for _, line := range strings.Split(want, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, bad := range []string{"shutdown-sessions", "check-ssl"} {
			if strings.Contains(line, bad) {
				t.Errorf("build/haproxy.cfg has %q (docs/decisions.md says why not): %s", bad, line)
			}
		}
	}
}

// startHAProxy runs haproxy in the foreground with haproxyConfig until
// the test ends, once it accepts connections on listen.
func (l *lab) startHAProxy(maxconn int, listen string, gateways, health []string) *proc {
	l.t.Helper()
	bin := testenv.NeedTool(l.t, "haproxy", "haproxy")
	cfg := filepath.Join(l.root, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(l.t, maxconn, listen, gateways, health)), 0o600); err != nil {
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
	l.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if l.t.Failed() {
			l.t.Logf("haproxy:\n%s", se.String())
		}
	})
	end := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			c.Close()
			return p
		}
		select {
		case <-p.done:
			l.t.Fatalf("haproxy exited: %v\n%s", p.err, se.String())
		default:
		}
		if time.Now().After(end) {
			l.t.Fatalf("haproxy does not accept on %s: %v", listen, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
