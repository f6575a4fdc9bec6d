package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type cmdView struct {
	ID, State, Status, Error string
	Output                   json.RawMessage
}

func (l *lab) runKind(g *gw, node, kind, body string) (int, cmdView) {
	l.t.Helper()
	args := []string{"run", node, kind, "--wait", "--data-dir", g.dataDir}
	if body != "" {
		args = append(args, "--body", body)
	}
	code, out, errOut := l.run("", nil, "bcgw", args...)
	var v cmdView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		l.t.Fatalf("bcgw run %s: %v: %s %s", kind, err, out, errOut)
	}
	return code, v
}

// TestNodeKinds: the v0.1 node kinds on a fakehw machine: inventory.refresh,
// diag.nvml passing and then failing on an injected Xid, gpu.reset clearing
// it and reading the health back.
func TestNodeKinds(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1")
	cfg, id := l.joinNode(g, "n", tok, "node")
	l.startEnv([]string{"BCD_FAKEHW_SEED=42"}, "bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	code, v := l.runKind(g, id, "inventory.refresh", "")
	var inv struct {
		Schema string
		Hash   string
		GPUs   []struct{ UUID, PCIBusID string } `json:"gpus"`
	}
	if err := json.Unmarshal(v.Output, &inv); err != nil || code != 0 {
		t.Fatalf("inventory.refresh: exit %d %v %+v", code, err, v)
	}
	if inv.Schema != "bcd.inventory/v1" || len(inv.GPUs) != 8 || !strings.HasPrefix(inv.Hash, "sha256:") {
		t.Fatalf("inventory: schema %q, %d GPUs, hash %q", inv.Schema, len(inv.GPUs), inv.Hash)
	}

	if code, v := l.runKind(g, id, "diag.nvml", ""); code != 0 || v.Status != "SUCCEEDED" {
		t.Fatalf("diag.nvml on a healthy machine: %d %+v", code, v)
	}
	bad := inv.GPUs[3].UUID
	xids, _ := json.Marshal([]map[string]any{{"code": 79, "uuid": bad, "message": "GPU has fallen off the bus."}})
	if err := os.WriteFile(filepath.Join(filepath.Dir(cfg), "data", "fakehw", "xids.json"), xids, 0o600); err != nil {
		t.Fatal(err)
	}
	code, v = l.runKind(g, id, "diag.nvml", "")
	if code != 1 || v.Status != "FAILED" || !strings.Contains(v.Error, "xid.recent") || !strings.Contains(v.Error, bad) {
		t.Fatalf("diag.nvml with an Xid: %d %+v", code, v)
	}

	code, v = l.runKind(g, id, "gpu.reset", `{"gpu":"`+bad+`"}`)
	var reset struct {
		GPU     string
		Healthy bool
	}
	if err := json.Unmarshal(v.Output, &reset); err != nil || code != 0 || !reset.Healthy || reset.GPU != bad {
		t.Fatalf("gpu.reset: %d %+v %s", code, reset, v.Output)
	}
	if code, v := l.runKind(g, id, "diag.nvml", ""); code != 0 {
		t.Fatalf("diag.nvml after the reset: %d %+v", code, v)
	}
	if code, v := l.runKind(g, id, "gpu.reset", `{"gpu":"GPU-nope"}`); code != 1 || !strings.Contains(v.Error, "no GPU") {
		t.Fatalf("gpu.reset of an unknown GPU: %d %+v", code, v)
	}
	if code, v := l.runKind(g, id, "gpu.reset", `{"gpu":"0","force":true}`); code != 1 || !strings.Contains(v.Error, "unknown field") {
		t.Fatalf("gpu.reset with an unknown field: %d %+v", code, v)
	}
}

// TestHardwareCommand: bcd hardware prints the machine (the fake one of
// BCD_FAKEHW_SEED in a fakehw build), the same for the same seed.
func TestHardwareCommand(t *testing.T) {
	l := newLab(t)
	var hashes []string
	for range 2 {
		code, out, errOut := l.run("", []string{"BCD_FAKEHW_SEED=7"}, "bcd-node", "hardware", "--json", "--config", "/nonexistent")
		var inv struct {
			Hash string
			GPUs []json.RawMessage `json:"gpus"`
		}
		if err := json.Unmarshal([]byte(out), &inv); err != nil || code != 0 || len(inv.GPUs) != 8 {
			t.Fatalf("hardware --json: exit %d %v %d GPUs %s", code, err, len(inv.GPUs), errOut)
		}
		hashes = append(hashes, inv.Hash)
	}
	if hashes[0] != hashes[1] {
		t.Fatalf("same seed, different hashes %v", hashes)
	}
	if code, out, _ := l.run("", nil, "bcd-node-host", "hardware"); code != 0 || !strings.Contains(out, "backend    host") {
		t.Fatalf("host hardware: exit %d %q", code, out)
	}
}
