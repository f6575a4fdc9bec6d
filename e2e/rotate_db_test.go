package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// TestCommandKeyRotationOnDatabase: bcgw trust rotate-key through one of
// two gateways on one PostgreSQL (behind HAProxy) with 3 connected nodes.
// The new key, sealed in the database, and the bundle naming it move
// together; the other gateway takes both and signs with the new key. No
// node joins again, and agent.ping runs on each node through either
// gateway: with both keys roots, with the old key removed as a root (so
// only signatures of the new key count, on both gateways), and after both
// gateways restarted; a spec signed with the new key is applied.
func TestCommandKeyRotationOnDatabase(t *testing.T) {
	h := newHALab(t, 2)
	ids := h.threeNodes(h.front(0))
	each := func(when string) {
		t.Helper()
		for i, g := range h.gws {
			h.pingAll(g, ids, when+", through "+h.gwName(i))
		}
	}
	each("before the rotation")

	var r adminapi.KeyRotation
	if err := json.Unmarshal([]byte(h.bcgw(h.gws[0], "trust", "rotate-key", "--json")), &r); err != nil {
		t.Fatal(err)
	}
	if r.OldPin == r.NewPin || r.OldPublicKey != filepath.Join(h.gws[0].dataDir, "command-signing.old.pub") || r.Version != 2 {
		t.Fatalf("rotate-key: %+v", r)
	}
	h.waitTrust(h.gws[1], ids, r.Version)
	each("both keys roots")

	out := h.bcgw(h.gws[1], "trust", "remove-root", "--key", r.OldPublicKey)
	if strings.TrimSpace(out) != itoa(int(r.Version+1)) {
		t.Fatalf("remove-root printed %q", out)
	}
	h.waitTrust(h.gws[0], ids, r.Version+1)
	each("only the new key a root")
	for i, g := range h.gws {
		var tv adminapi.TrustView
		if err := json.Unmarshal([]byte(h.bcgw(g, "trust", "show", "--json")), &tv); err != nil || tv.OwnKey != r.NewPin || !tv.OwnKeyIsRoot || len(tv.Roots) != 1 {
			t.Errorf("trust show on %s: %+v %v", h.gwName(i), tv, err)
		}
	}
	gen := h.spec(h.gws[1], "set", ids[0], `{"devices":{"holds":[{"allocation":"rot","gpus":["0"]}]}}`)
	h.waitStatus(h.gws[0], ids[0], "applied the spec the new key signed", func(s adminapi.StatusView) bool { return s.AppliedGeneration == gen })

	joined := 0
	for i, g := range h.gws {
		joined += strings.Count(g.stderr.String(), `"msg":"node joined"`)
		g.signal(syscall.SIGTERM)
		g.wait(t, 15*time.Second)
		h.startGW(i)
	}
	if joined != 3 {
		t.Errorf("%d joins before the restart, want the 3 nodes' first", joined)
	}
	for _, id := range ids {
		h.waitNode(h.gws[0], id, "connected again", func(n nodeView) bool { return n.Connected })
	}
	each("after both gateways restarted")
	if n := len(h.nodes(h.gws[1])); n != 3 {
		t.Errorf("%d nodes, want the 3", n)
	}
	for i, g := range h.gws {
		if n := strings.Count(g.stderr.String(), `"msg":"node joined"`); n != 0 {
			t.Errorf("%d nodes joined %s again after its restart", n, h.gwName(i))
		}
	}
}
