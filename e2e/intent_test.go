package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/machine/fakekinds"
	"github.com/better-compute/bcd/components/trust/pki"
)

// keyFile writes a new P-256 key (PKCS#8 PEM, 0600) and returns its path.
func (l *lab) keyFile(name string) string {
	l.t.Helper()
	k, err := pki.GenerateKey()
	if err != nil {
		l.t.Fatal(err)
	}
	b, err := pki.MarshalPrivateKeyPEM(k)
	if err != nil {
		l.t.Fatal(err)
	}
	p := filepath.Join(l.root, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		l.t.Fatal(err)
	}
	return p
}

// prepared is a command as bcgw run --prepare prints it.
type prepared map[string]any

func (l *lab) prepare(g *gw, node, kind string, extra ...string) prepared {
	l.t.Helper()
	out := l.bcgw(g, append([]string{"run", node, kind, "--prepare"}, extra...)...)
	var p prepared
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		l.t.Fatalf("bcgw run --prepare printed %q: %v", out, err)
	}
	return p
}

func (l *lab) writeJSON(name string, v any) string {
	l.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		l.t.Fatal(err)
	}
	p := filepath.Join(l.root, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		l.t.Fatal(err)
	}
	return p
}

// sign runs bcgw sign (no data dir: an approver's or key holder's
// machine) over p with key.
func (l *lab) sign(p prepared, key string) prepared {
	l.t.Helper()
	in := l.writeJSON("to-sign.json", p)
	code, out, errOut := l.run("", nil, "bcgw", "sign", "--key", key, "--in", in)
	if code != 0 {
		l.t.Fatalf("bcgw sign: exit %d %s", code, errOut)
	}
	var s prepared
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		l.t.Fatal(err)
	}
	keyPEM, _ := os.ReadFile(key)
	if strings.Contains(out+errOut, strings.TrimSpace(string(keyPEM))) {
		l.t.Fatal("bcgw sign printed the key")
	}
	return s
}

// submit sends a prepared command as it is and returns its result view.
func (l *lab) submit(g *gw, p prepared) cmdView {
	l.t.Helper()
	in := l.writeJSON("submit.json", p)
	_, out, errOut := l.run("", nil, "bcgw", "run", "--submit", in, "--wait", "--data-dir", g.dataDir)
	var v cmdView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		l.t.Fatalf("bcgw run --submit: %v: %s %s", err, out, errOut)
	}
	return v
}

func marks(t *testing.T, dataDir string) int {
	b, _ := os.ReadFile(filepath.Join(dataDir, fakekinds.MarkFile))
	return strings.Count(string(b), "\n")
}

// TestSignedIntent: bcgw publishes its own command key as a root, so the
// node enforces signed intent; what bcgw signs runs; an unsigned command,
// one signed by a key that is no root, one whose signature covers another
// node, one whose deadline was moved after signing and a signed one
// replayed past its deadline are refused with their reason, and the
// fakehw marker shows none ran. A desired state without a valid signature
// is refused too, the held spec kept.
func TestSignedIntent(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	var st struct {
		SignedIntent struct {
			Version  uint64 `json:"trust_bundle_version"`
			Enforced bool   `json:"enforced"`
		} `json:"signed_intent"`
	}
	// Connected is the gateway's view; the node takes the trust bundle
	// just after its Welcome.
	eventually(t, "bcd status shows signed intent enforced", func() error {
		code, out, _ := l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
		if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || !st.SignedIntent.Enforced || st.SignedIntent.Version == 0 {
			return fmt.Errorf("bcd status: signed intent %+v (%v)", st.SignedIntent, err)
		}
		return nil
	})

	// What bcgw signs runs.
	if code, v := l.runKind(g, id, "fakehw.mark", ""); code != 0 || v.Status != "SUCCEEDED" {
		t.Fatalf("a command bcgw signed: exit %d %+v", code, v)
	}
	if n := marks(t, data); n != 1 {
		t.Fatalf("marks %d", n)
	}

	gwKey := filepath.Join(g.dataDir, "command-signing.key")
	other := l.keyFile("other.key")
	for _, tc := range []struct {
		name   string
		p      func() prepared
		status string
		reason string
	}{
		{"unsigned", func() prepared { return l.prepare(g, id, "fakehw.mark") }, "UNSIGNED", "no signature"},
		{"a key that is no root", func() prepared { return l.sign(l.prepare(g, id, "fakehw.mark"), other) }, "BAD_SIGNATURE", "not a command-signing root"},
		{"another node's id", func() prepared {
			p := l.prepare(g, id, "fakehw.mark")
			p["node_id"] = "node_someoneelse"
			s := l.sign(p, gwKey)
			s["node_id"] = id
			return s
		}, "BAD_SIGNATURE", "does not match"},
		{"a deadline moved after signing", func() prepared {
			s := l.sign(l.prepare(g, id, "fakehw.mark", "--deadline", "1m"), gwKey)
			s["deadline_unix_ms"] = s["deadline_unix_ms"].(float64) + 3600_000
			return s
		}, "BAD_SIGNATURE", "does not match"},
	} {
		v := l.submit(g, tc.p())
		if v.Status != tc.status || !strings.Contains(v.Error, tc.reason) {
			t.Errorf("%s: %s %q, want %s %q", tc.name, v.Status, v.Error, tc.status, tc.reason)
		}
	}
	// A signed command that reaches the node only after its deadline (the
	// node was down; bcgw delivers it after the next Welcome) is refused.
	node.signal(syscall.SIGTERM)
	node.wait(t, 15*time.Second)
	late := l.sign(l.prepare(g, id, "fakehw.mark", "--deadline", "2s"), gwKey)
	l.bcgw(g, "run", "--submit", l.writeJSON("late.json", late))
	time.Sleep(2500 * time.Millisecond)
	node = l.start("bcd-node", "node", "--config", cfg)
	admin := adminapi.NewClient(g.dataDir, "", "")
	c, err := admin.Command(context.Background(), late["id"].(string), 30*time.Second)
	if err != nil || c.Status != "REFUSED" || !strings.Contains(c.Error, "past its deadline") {
		t.Errorf("a signed command delivered past its deadline: %v %+v", err, c)
	}
	// A command signed by a root outside bcgw (bcgw sign on the key
	// holder's machine) runs.
	if v := l.submit(g, l.sign(l.prepare(g, id, "fakehw.mark"), gwKey)); v.Status != "SUCCEEDED" {
		t.Errorf("signed outside bcgw with a root: %+v", v)
	}
	if n := marks(t, data); n != 2 {
		t.Errorf("marks %d, want 2: a refused command ran", n)
	}

	// Desired state: a spec bcgw signs converges; a prepared spec signed by
	// a key that is no root is refused and the held spec stays.
	gen := l.spec(g, "set", id, `{"fakehw":{"files":{"a":"1"}}}`)
	l.waitStatus(g, id, "observed", func(s adminapi.StatusView) bool { return s.ObservedGeneration == gen })
	in := l.writeJSON("spec.json", map[string]any{"fakehw": map[string]any{"files": map[string]string{"a": "2"}}})
	var ps prepared
	if err := json.Unmarshal([]byte(l.bcgw(g, "spec", "prepare", id, "--file", in)), &ps); err != nil {
		t.Fatal(err)
	}
	signedSpec := l.writeJSON("signed-spec.json", l.sign(ps, other))
	l.bcgw(g, "spec", "submit", signedSpec)
	stv := l.waitStatus(g, id, "refused the spec", func(s adminapi.StatusView) bool { return s.RefusedGeneration > gen })
	if !strings.Contains(stv.SpecError, "BAD_SIGNATURE") || stv.AppliedGeneration != gen {
		t.Errorf("a spec signed by no root: %+v", stv)
	}
	if got := readFile(t, filepath.Join(data, fakekinds.SectionDir, "a")); got != "1" {
		t.Errorf("a refused spec was applied: a = %q", got)
	}
	// The prepared spec submitted unsigned, as bcgw sends it on: the node
	// holds roots, so it refuses it too.
	refused := stv.RefusedGeneration
	in3 := l.writeJSON("spec3.json", map[string]any{"fakehw": map[string]any{"files": map[string]string{"a": "3"}}})
	var unsigned prepared
	if err := json.Unmarshal([]byte(l.bcgw(g, "spec", "prepare", id, "--file", in3)), &unsigned); err != nil {
		t.Fatal(err)
	}
	if _, ok := unsigned["signature"]; ok {
		t.Fatalf("a prepared spec carries a signature: %v", unsigned)
	}
	l.bcgw(g, "spec", "submit", l.writeJSON("unsigned-spec.json", unsigned))
	stv = l.waitStatus(g, id, "refused the unsigned spec", func(s adminapi.StatusView) bool {
		return s.RefusedGeneration > refused || s.AppliedGeneration > gen
	})
	if !strings.Contains(stv.SpecError, "UNSIGNED") || stv.AppliedGeneration != gen {
		t.Errorf("unsigned intent is refused once roots exist: an unsigned spec was not refused UNSIGNED: applied %d (held %d), error %q", stv.AppliedGeneration, gen, stv.SpecError)
	}
	time.Sleep(500 * time.Millisecond) // time for a pass, had the spec been taken
	if got := readFile(t, filepath.Join(data, fakekinds.SectionDir, "a")); got != "1" {
		t.Errorf("unsigned intent is refused once roots exist: an unsigned spec was applied: a = %q", got)
	}
}
