package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

type cmdView struct {
	ID, State, Status, Error string
	Output                   json.RawMessage
	Attested                 bool
	Attestation              []byte
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

// TestLogsCollect: logs.collect PUTs a redacted tar.gz to a presigned
// https URL; a secret planted in config.toml and the URL's signature appear
// neither in the bundle nor in any log.
func TestLogsCollect(t *testing.T) {
	var mu sync.Mutex
	var got []byte
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			http.Error(w, "PUT only", http.StatusMethodNotAllowed)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = b
		mu.Unlock()
	}))
	defer srv.Close()
	l := newLab(t)
	caFile := filepath.Join(l.root, "upload-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1")
	cfg, id := l.joinNode(g, "n", tok, "node")
	planted := "bcjt_jtplanted_" + strings.Repeat("s3cr3t", 5)
	b, _ := os.ReadFile(cfg)
	if err := os.WriteFile(cfg, append([]byte("# "+planted+"\n"), b...), 0o600); err != nil {
		t.Fatal(err)
	}
	l.startEnv([]string{"BCD_FAKEHW_EXTRA_CA=" + caFile}, "bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	sig := "X-Amz-Signature=" + strings.Repeat("abcd", 16)
	code, v := l.runKind(g, id, "logs.collect", `{"url":"`+srv.URL+`/bucket/bundle.tgz?`+sig+`","since":"1h"}`)
	if code != 0 || v.Status != "SUCCEEDED" {
		t.Fatalf("logs.collect: %d %+v", code, v)
	}
	mu.Lock()
	bundle := got
	mu.Unlock()
	zr, err := gzip.NewReader(bytes.NewReader(bundle))
	if err != nil {
		t.Fatalf("upload is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	names := map[string]string{}
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		c, _ := io.ReadAll(tr)
		names[h.Name] = string(c)
	}
	if _, ok := names["manifest.json"]; !ok {
		t.Fatalf("bundle files: %v", keys(names))
	}
	conf, ok := names["config.toml"]
	if !ok || !strings.Contains(conf, "gateway") {
		t.Fatalf("bundle lacks config.toml: %v", keys(names))
	}
	for n, c := range names {
		if strings.Contains(c, planted) || strings.Contains(c, "s3cr3ts3cr3t") {
			t.Errorf("bundle file %s holds the planted token", n)
		}
	}
	l.out.assertAbsent(t, "the presigned URL's signature", sig)
	l.out.assertAbsent(t, "the join token", tok)

	// http:// is refused.
	if code, v := l.runKind(g, id, "logs.collect", `{"url":"http://127.0.0.1:1/x"}`); code != 1 || !strings.Contains(v.Error, "https") {
		t.Fatalf("http URL: %d %+v", code, v)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
