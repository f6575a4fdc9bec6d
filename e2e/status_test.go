package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestStatusAndDoctor: bcd status reads the running agent over its status
// socket; bcd doctor checks config, identity, gateway and the (fake) GPUs.
func TestStatusAndDoctor(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1", "--site", "fsn1")
	cfg, id := l.joinNode(g, "n", tok, "node")

	if code, _, errOut := l.run("", nil, "bcd-node", "status", "--config", cfg); code != 1 || !strings.Contains(errOut, "bcd.sock") {
		t.Fatalf("status without an agent: exit %d %q", code, errOut)
	}
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	code, out, errOut := l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
	var st struct {
		NodeID    string `json:"node_id"`
		Site      string
		Role      string
		Connected bool
		Epoch     uint64
		KeyHolder string `json:"key_holder"`
		ValidFor  string `json:"certificate_valid_for"`
		Lanes     []struct{ Lane string }
		GPUs      []struct{ UUID, Health string }
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("status --json: exit %d %v %s %s", code, err, out, errOut)
	}
	if st.NodeID != id || st.Site != "fsn1" || st.Role != "node" || !st.Connected || st.Epoch != 1 ||
		st.KeyHolder != "a file" || st.ValidFor == "" || len(st.Lanes) != 3 || len(st.GPUs) != 8 {
		t.Fatalf("status: %+v", st)
	}
	for _, gpu := range st.GPUs {
		// The fake machine's GPUs are healthy: the health checks judge
		// each, and none fails.
		if gpu.Health != "ok" && gpu.Health != "warn" {
			t.Errorf("status: GPU %s health %q", gpu.UUID, gpu.Health)
		}
	}
	if code, out, _ := l.run("", nil, "bcd-node", "status", "--config", cfg); code != 0 || !strings.Contains(out, id) {
		t.Fatalf("status text: exit %d %q", code, out)
	}

	_, out, errOut = l.run("", nil, "bcd-node", "doctor", "--config", cfg, "--json")
	var results []struct{ Name, Status, Detail string }
	if err := json.Unmarshal([]byte(out), &results); err != nil {
		t.Fatalf("doctor --json: %v %s %s", err, out, errOut)
	}
	want := map[string]string{"config": "", "identity": id, "gateway": "reachable", "nvml": "8 GPUs", "hardware": "fakehw"}
	gpuLines := 0
	for _, r := range results {
		if r.Name == "gpu" {
			gpuLines++
			if r.Status == "fail" || !strings.Contains(r.Detail, "% busy") {
				t.Errorf("doctor gpu: %s %q", r.Status, r.Detail)
			}
		}
		if w, ok := want[r.Name]; ok {
			if r.Status == "fail" || !strings.Contains(r.Detail, w) {
				t.Errorf("doctor %s: %s %q (want ok/warn mentioning %q)", r.Name, r.Status, r.Detail, w)
			}
			delete(want, r.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("doctor lacks checks %v: %s", want, out)
	}
	if gpuLines != 8 {
		t.Errorf("doctor printed %d gpu lines, want one per GPU (8): %s", gpuLines, out)
	}
}
