package e2e

import (
	"crypto/tls"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// threeNodes starts three fakehw nodes joined to g and waits until they
// are connected.
func (l *lab) threeNodes(g *gw) []string {
	l.t.Helper()
	var ids []string
	for _, name := range []string{"a", "b", "c"} {
		cfg, id := l.joinNode(g, name, l.token(g, "--uses", "1"), "node")
		l.start("bcd-node", "node", "--config", cfg)
		ids = append(ids, id)
	}
	for _, id := range ids {
		l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	}
	return ids
}

// pingAll runs agent.ping on every node and fails unless each succeeds.
func (l *lab) pingAll(g *gw, ids []string, when string) {
	l.t.Helper()
	for _, id := range ids {
		if code, v := l.runKind(g, id, "agent.ping", ""); code != 0 || v.Status != "SUCCEEDED" {
			l.t.Fatalf("%s: agent.ping on %s: exit %d %+v", when, id, code, v)
		}
	}
}

// waitTrust waits until every node says it holds trust bundle version v.
func (l *lab) waitTrust(g *gw, ids []string, v uint64) {
	l.t.Helper()
	end := time.Now().Add(60 * time.Second)
	for {
		var tv adminapi.TrustView
		if err := json.Unmarshal([]byte(l.bcgw(g, "trust", "show", "--json")), &tv); err != nil {
			l.t.Fatal(err)
		}
		held := 0
		for _, n := range tv.Nodes {
			if n.TrustVersion == v && n.Connected {
				held++
			}
		}
		if held == len(ids) {
			return
		}
		if time.Now().After(end) {
			l.t.Fatalf("not every node holds trust bundle version %d within 60 s: %+v", v, tv.Nodes)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestCommandKeyRotation: bcgw trust rotate-key with 3 connected nodes;
// none joins again, and commands still run: with both keys roots, with
// the old key removed as a root (so only the new key's signatures count),
// and after bcgw restarts (the new key was kept).
func TestCommandKeyRotation(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0")
	ids := l.threeNodes(g)
	l.pingAll(g, ids, "before the rotation")

	var r adminapi.KeyRotation
	if err := json.Unmarshal([]byte(l.bcgw(g, "trust", "rotate-key", "--json")), &r); err != nil {
		t.Fatal(err)
	}
	if r.OldPin == r.NewPin || r.OldPublicKey != filepath.Join(gwDir, "command-signing.old.pub") {
		t.Fatalf("rotate-key: %+v", r)
	}
	var tv adminapi.TrustView
	if err := json.Unmarshal([]byte(l.bcgw(g, "trust", "show", "--json")), &tv); err != nil || tv.OwnKey != r.NewPin || !tv.OwnKeyIsRoot || len(tv.Roots) != 2 {
		t.Fatalf("trust show after the rotation: %+v %v", tv, err)
	}
	l.waitTrust(g, ids, r.Version)
	l.pingAll(g, ids, "both keys roots")

	out := l.bcgw(g, "trust", "remove-root", "--key", r.OldPublicKey)
	l.waitTrust(g, ids, r.Version+1)
	if strings.TrimSpace(out) != itoa(int(r.Version+1)) {
		t.Fatalf("remove-root printed %q", out)
	}
	l.pingAll(g, ids, "only the new key a root")
	gen := l.spec(g, "set", ids[0], `{"devices":{"holds":[{"allocation":"rot","gpus":["0"]}]}}`)
	l.waitStatus(g, ids[0], "applied the spec the new key signed", func(s adminapi.StatusView) bool { return s.AppliedGeneration == gen })

	g.signal(syscall.SIGTERM)
	g.wait(t, 15*time.Second)
	g = l.startGateway(gwDir, "127.0.0.1:"+strings.Split(g.addr, ":")[1])
	for _, id := range ids {
		l.waitNode(g, id, "connected again", func(n nodeView) bool { return n.Connected })
	}
	l.pingAll(g, ids, "after bcgw restarted")
	if n := len(l.nodes(g)); n != 3 {
		t.Errorf("%d nodes, want the 3", n)
	}
	if n := strings.Count(g.stderr.String(), `"msg":"node joined"`); n != 0 {
		t.Errorf("%d nodes joined again", n)
	}
}

// servedSerial is the serial of the leaf the gateway presents to a new
// TLS handshake.
func servedSerial(t *testing.T, addr string) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)
}

// TestServingCertRenew: bcgw serving-cert renew gives the gateway a new
// serving leaf while it serves: new handshakes get it, the pins do not
// change, and a node that dials again (killed and started) connects with
// no new join and runs a command.
func TestServingCertRenew(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	pins := l.bcgw(g, "well-known", "--pins")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	before := servedSerial(t, g.addr)
	var v adminapi.ServingView
	if err := json.Unmarshal([]byte(l.bcgw(g, "serving-cert", "renew", "--json")), &v); err != nil {
		t.Fatal(err)
	}
	if v.Serial == before || servedSerial(t, g.addr) != v.Serial || v.NotAfter.Sub(v.NotBefore) < 29*24*time.Hour {
		t.Fatalf("renewed %+v; served before %s, now %s", v, before, servedSerial(t, g.addr))
	}
	if l.bcgw(g, "well-known", "--pins") != pins {
		t.Error("the pins changed")
	}
	node.signal(syscall.SIGKILL)
	node.wait(t, 10*time.Second)
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected again", func(n nodeView) bool { return n.Connected && n.Epoch >= 2 })
	l.pingAll(g, []string{id}, "after the renewal")
	if strings.Count(g.stderr.String(), `"msg":"node joined"`) != 1 {
		t.Error("the node joined again")
	}
}
