package instances

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/vm/qcow2"
	"github.com/better-compute/bcd/components/vm/snapshot"
	"github.com/better-compute/bcd/components/vm/spec"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// snap makes a snapshot archive as instance.snapshot does: a 64 MiB
// qcow2 disk made with qemuArgs (a pattern written at 1 MiB), a manifest
// of m, and with memory a stand-in memory member; served at path.
func (h *host) snap(path string, m snapshot.Manifest, qemuArgs ...string) spec.Restore {
	h.t.Helper()
	dir := h.t.TempDir()
	disk := filepath.Join(dir, "disk.qcow2")
	args := append(append([]string{"create", "-q", "-f", "qcow2"}, qemuArgs...), disk, "64M")
	if out, err := exec.Command(h.qemuImg, args...).CombinedOutput(); err != nil {
		h.t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 1M 64k", disk).CombinedOutput(); err != nil && len(qemuArgs) == 0 {
		h.t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	mem := ""
	if m.Memory {
		mem = filepath.Join(dir, "memory.save")
		if err := os.WriteFile(mem, []byte("LibvirtQemudSave stand-in"), 0o600); err != nil {
			h.t.Fatal(err)
		}
	}
	archive := filepath.Join(dir, "snap.tar")
	if _, _, err := snapshot.WriteArchive(archive, m, disk, mem); err != nil {
		h.t.Fatal(err)
	}
	b, _ := os.ReadFile(archive)
	im := h.image(path, "raw", b)
	return spec.Restore{URL: im.URL, SHA256: im.SHA256, Memory: m.Memory}
}

func manifest(memory bool) snapshot.Manifest {
	return snapshot.Manifest{Version: 1, Instance: "vm-src", VCPUs: 1, MemoryMiB: 128, Memory: memory, CPU: snapshot.HostCPU(), Created: time.Now().UTC()}
}

func restored(id, state string, r spec.Restore) spec.Instance {
	return spec.Instance{ID: id, Allocation: "alloc_" + id, State: state, VCPUs: 1, MemoryMiB: 128, RestoreFrom: &r}
}

// TestRestoreFrom: an instance restored from a disk snapshot converges
// with its disk an overlay of exactly the snapshot's flattened disk,
// whose bytes it reads; on a restart nothing changes; once no instance
// restores from it, the snapshot (archive and unpacked) is deleted.
func TestRestoreFrom(t *testing.T) {
	h := newHost(t)
	r := h.snap("/snap.tar", manifest(false))
	body := spec.Body{Instances: []spec.Instance{restored("vm-r", vmruntime.Running, r)}}
	if err, left := h.pass(body); err != nil || len(left) != 0 {
		t.Fatalf("restore: %v, %v", err, left)
	}
	if d := h.domains(); d["vm-r"].State != vmruntime.Running {
		t.Fatalf("domains %+v", d)
	}
	disk := filepath.Join(h.dir, "instances", "vm-r", DiskFile)
	base := filepath.Join(h.dir, "snapshots", r.SHA256+".d", snapshot.DiskFile)
	if _, err := qcow2.CheckFile(disk, qcow2.Backing{Path: base, Format: "qcow2"}); err != nil {
		t.Errorf("the instance's disk is not an overlay of the snapshot's: %v", err)
	}
	if out, err := exec.Command("qemu-io", "-c", "read -P 0x5a 1M 64k", disk).CombinedOutput(); err != nil || strings.Contains(string(out), "verification failed") {
		t.Errorf("the restored disk lacks the snapshot's bytes: %v %s", err, out)
	}
	h.restart()
	if err, left := h.pass(body); err != nil || len(left) != 0 {
		t.Fatalf("after a restart: %v, %v", err, left)
	}
	if err, _ := h.pass(spec.Body{}); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(filepath.Join(h.dir, "snapshots")); len(left) != 1 || left[0].Name() != "tmp" {
		t.Errorf("snapshots left after no instance restores from them: %v", left)
	}
}

// TestRestoreRefused: a snapshot whose SHA-256 differs, one whose disk
// names a backing file, a memory snapshot into another memory size and a
// download that stalls each fail their instance alone with the reason;
// the good one converges. Without the digest, backing or shape check its
// case fails (tried once each).
func TestRestoreRefused(t *testing.T) {
	h := newHost(t)
	good := h.snap("/good.tar", manifest(false))
	wrongSum := h.snap("/sum.tar", manifest(false))
	wrongSum.SHA256 = good.SHA256[:63] + "0"
	if wrongSum.SHA256 == good.SHA256 {
		wrongSum.SHA256 = good.SHA256[:63] + "1"
	}
	backing := h.snap("/backing.tar", manifest(false), "-u", "-b", "/etc/shadow", "-F", "raw")
	bigger := h.snap("/mem.tar", manifest(true))
	stalled := h.snap("/stalled.tar", manifest(false))
	h.stalled = "/stalled.tar"
	big := restored("vm-mem", vmruntime.Running, bigger)
	big.MemoryMiB = 256
	body := spec.Body{Instances: []spec.Instance{restored("vm-good", vmruntime.Running, good), restored("vm-sum", vmruntime.Running, wrongSum),
		restored("vm-backing", vmruntime.Running, backing), big, restored("vm-stall", vmruntime.Running, stalled)}}
	start := time.Now()
	reasons := map[string]string{}
	raw, _ := json.Marshal(body)
	ctx := context.Background()
	for time.Since(start) < 20*time.Second && len(reasons) < 4 {
		p, err := h.s.Plan(ctx, raw)
		if err != nil {
			t.Fatal(err)
		}
		h.s.Apply(ctx, raw, p)
		for _, e := range h.events {
			var b map[string]string
			json.Unmarshal([]byte(strings.TrimPrefix(e, "InstanceFailed ")), &b)
			reasons[b["instance"]] = b["reason"]
		}
		time.Sleep(50 * time.Millisecond)
	}
	for id, want := range map[string]string{
		"vm-sum":     "snapshot: images: image refused: ",
		"vm-backing": "snapshot " + backing.SHA256 + ": snapshot refused: its disk as a base image: qcow2 image names a backing file",
		"vm-mem":     "restore_from: a memory snapshot of 1 vCPUs and 128 MiB resumes only into the same shape, not 1 vCPUs and 256 MiB",
		"vm-stall":   "transfer stalled: less than 1048576 bytes in 500ms",
	} {
		if !strings.Contains(reasons[id], want) {
			t.Errorf("%s failed with %q, want %q", id, reasons[id], want)
		}
	}
	if strings.Contains(reasons["vm-stall"], "/stalled.tar") && !strings.Contains(reasons["vm-stall"], "https://") {
		t.Errorf("reason %q", reasons["vm-stall"])
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the stalled download took %v to end (window 500ms)", took)
	}
	if d := h.domains(); d["vm-good"].State != vmruntime.Running || len(d) != 1 {
		t.Errorf("domains %+v; want vm-good alone, RUNNING", d)
	}
}
