package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/vm/qcow2"
)

// TestSnapshotRestoreOnFakeRuntime: on a fakehw node, `bcgw snapshot`
// of a STOPPED instance PUTs one archive to a presigned https URL on
// loopback and prints its SHA-256; `bcgw instance add --restore-from`
// starts a second instance from it, fetched back over https through its
// pin: its disk is an overlay of the snapshot's flattened disk and reads
// the bytes written into the first instance's disk; removing it deletes
// the snapshot. The URL's signature reaches no log and no output.
func TestSnapshotRestoreOnFakeRuntime(t *testing.T) {
	l := newLab(t)
	digest, imageURL, pin := imageServer(t, l)
	var mu sync.Mutex
	stored := map[string][]byte{}
	puts := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method {
		case http.MethodPut:
			b, _ := io.ReadAll(r.Body)
			stored[r.URL.Path] = b
			puts++
		case http.MethodGet:
			b, ok := stored[r.URL.Path]
			if !ok {
				http.NotFound(w, r)
				return
			}
			w.Write(b)
		}
	}))
	defer srv.Close()
	caFile := filepath.Join(l.root, "upload-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	l.startEnv([]string{"BCD_FAKEHW_EXTRA_CA=" + caFile}, "bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	converged := func(what string) {
		t.Helper()
		l.waitStatus(g, id, what, func(s adminapi.StatusView) bool {
			return s.ObservedGeneration == s.SpecGeneration && section(s, "instances").State == "CONVERGED"
		})
	}
	l.bcgw(g, "instance", "add", id, "--id", "vm-a", "--alloc", "alloc_a", "--image", digest+"="+imageURL, "--spki-pin", pin,
		"--memory-mib", "128", "--state", "STOPPED")
	converged("vm-a converged")
	disk := filepath.Join(data, "instances", "vm-a", "disk.qcow2")
	if out, err := exec.Command("qemu-io", "-c", "write -P 0x5a 1M 64k", disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}

	sig := "X-Amz-Signature=" + strings.Repeat("feed", 16)
	out := l.bcgw(g, "snapshot", id, "vm-a", "--to", srv.URL+"/bucket/vm-a.tar?"+sig)
	var view adminapi.CommandView
	if err := json.Unmarshal([]byte(out), &view); err != nil || view.Status != "SUCCEEDED" {
		t.Fatalf("bcgw snapshot: %v\n%s", err, out)
	}
	var res struct {
		SHA256   string `json:"sha256"`
		Bytes    int64  `json:"bytes"`
		Target   string `json:"target"`
		Uploaded bool   `json:"uploaded"`
	}
	json.Unmarshal(view.Output, &res)
	mu.Lock()
	archive := stored["/bucket/vm-a.tar"]
	mu.Unlock()
	sum := sha256.Sum256(archive)
	if !res.Uploaded || res.SHA256 != hex.EncodeToString(sum[:]) || res.Bytes != int64(len(archive)) || res.Target != srv.URL || puts != 1 {
		t.Fatalf("result %+v; the target got %d bytes in %d PUTs", res, len(archive), puts)
	}
	if strings.Contains(out, sig) {
		t.Errorf("bcgw snapshot printed the URL's signature:\n%s", out)
	}

	l.bcgw(g, "instance", "add", id, "--id", "vm-b", "--alloc", "alloc_b", "--restore-from", res.SHA256+"="+srv.URL+"/bucket/vm-a.tar",
		"--spki-pin", pki.PinOfCert(srv.Certificate()), "--memory-mib", "128")
	converged("vm-b restored")
	restored := filepath.Join(data, "instances", "vm-b", "disk.qcow2")
	snapDisk := filepath.Join(data, "snapshots", res.SHA256+".d", "disk.qcow2")
	if _, err := qcow2.CheckFile(restored, qcow2.Backing{Path: snapDisk, Format: "qcow2"}); err != nil {
		t.Errorf("vm-b's disk is not an overlay of the snapshot's: %v", err)
	}
	if out, err := exec.Command("qemu-io", "-c", "read -P 0x5a 1M 64k", restored).CombinedOutput(); err != nil || strings.Contains(string(out), "verification failed") {
		t.Errorf("vm-b's disk lacks what vm-a's held: %v %s", err, out)
	}

	l.bcgw(g, "instance", "remove", id, "--id", "vm-b")
	converged("vm-b removed")
	for _, p := range []string{snapDisk, filepath.Join(data, "snapshots", res.SHA256+".raw")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want the snapshot deleted", p, err)
		}
	}
	l.out.assertAbsent(t, "the presigned URL's signature", sig)
}
