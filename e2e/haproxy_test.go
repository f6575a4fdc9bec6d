package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
)

// haproxyConfig is the configuration docs/gateway-store.md shows: TCP
// mode, TLS passed through to the gateways (each terminates it with the
// serving certificate the fleet shares), a health check every second on
// each gateway's GET /readyz (503 when its database does not answer, or
// it is shutting down; its sessions are then ended so agents redial), and
// a connection that fails to reach a gateway sent to another.
func haproxyConfig(listen string, gateways []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
    # Two descriptors per agent; the fleet's size, not more than ulimit -n allows.
    maxconn 4096

defaults
    mode tcp
    timeout connect 2s
    # Sessions are long-lived HTTP/2 streams with a heartbeat every 15 s.
    timeout client 10m
    timeout server 10m
    retries 3
    option redispatch

frontend agents
    bind %s
    default_backend gateways

backend gateways
    balance leastconn
    # A gateway is in rotation while GET /readyz answers 200: it answers 503
    # when its database is unreachable or it is shutting down.
    option httpchk
    http-check send meth GET uri /readyz
    http-check expect status 200
    default-server check check-ssl verify none inter 1s fall 2 rise 2 on-marked-down shutdown-sessions
`, listen)
	for i, g := range gateways {
		fmt.Fprintf(&b, "    server gw%d %s\n", i+1, g)
	}
	return b.String()
}

// startHAProxy runs haproxy in the foreground with haproxyConfig until
// the test ends, once it accepts connections on listen.
func (l *lab) startHAProxy(listen string, gateways []string) *proc {
	l.t.Helper()
	bin := testenv.NeedTool(l.t, "haproxy", "haproxy")
	cfg := filepath.Join(l.root, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(listen, gateways)), 0o600); err != nil {
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
