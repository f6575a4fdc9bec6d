package snapshot

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/base/stall"
	"github.com/better-compute/bcd/components/vm/libvirtrt"
	"github.com/better-compute/bcd/components/vm/rootvirt/rootvirttest"
	"github.com/better-compute/bcd/components/vm/vmruntime"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// target is an https upload server on loopback: it keeps every PUT's
// bytes, reads slowly when told, and can stop reading after a few bytes
// (a stalled transfer) or answer an error.
type target struct {
	srv     *httptest.Server
	mu      sync.Mutex
	puts    int
	got     []byte
	slow    time.Duration // a pause per 64 KiB read
	stallAt int           // stop reading after this many bytes (0: never)
	started chan struct{} // closed at the first PUT's first bytes
	quit    chan struct{} // closed when the test ends: a stalled PUT returns
	status  int
}

func newTarget(t *testing.T) *target {
	tg := &target{started: make(chan struct{}), quit: make(chan struct{})}
	var once sync.Once
	tg.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			http.Error(w, "PUT only", http.StatusMethodNotAllowed)
			return
		}
		tg.mu.Lock()
		tg.puts++
		slow, stallAt, status := tg.slow, tg.stallAt, tg.status
		tg.mu.Unlock()
		var buf bytes.Buffer
		chunk := make([]byte, 64<<10)
		for {
			if stallAt > 0 && buf.Len() >= stallAt {
				once.Do(func() { close(tg.started) })
				select {
				case <-r.Context().Done():
				case <-tg.quit:
				}
				return
			}
			n, err := r.Body.Read(chunk)
			buf.Write(chunk[:n])
			if n > 0 {
				once.Do(func() { close(tg.started) })
			}
			if err != nil {
				break
			}
			time.Sleep(slow)
		}
		if status != 0 {
			http.Error(w, "denied", status)
			return
		}
		tg.mu.Lock()
		tg.got = buf.Bytes()
		tg.mu.Unlock()
	}))
	t.Cleanup(tg.srv.Close)
	t.Cleanup(func() { close(tg.quit) })
	return tg
}

func (tg *target) url() string { return tg.srv.URL + "/bucket/snap.tar?X-Amz-Signature=sekrit" }

func (tg *target) putCount() int { tg.mu.Lock(); defer tg.mu.Unlock(); return tg.puts }

// members reads the uploaded archive.
func members(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name], _ = io.ReadAll(tr)
	}
}

type env struct {
	h   *rootvirttest.Host
	rt  *libvirtrt.Runtime
	cfg Config
	tg  *target
}

func newEnv(t *testing.T) *env {
	h := rootvirttest.New(t)
	rt := libvirtrt.New(libvirtrt.Config{URI: h.ReadOnlyURI(), InstancesDir: h.InstancesDir(), Helper: rootvirttest.RootHalf{Host: h.Root}, Signed: h.Signed})
	tg := newTarget(t)
	return &env{h: h, rt: rt, tg: tg, cfg: Config{DataDir: h.Data, Runtime: rt, Client: tg.srv.Client(), QEMUImg: h.QEMUImg, ProgressEvery: 20 * time.Millisecond}}
}

// running makes instance id (64 MiB, 1 vCPU) in state, its overlay
// carrying a pattern the guest's disk must keep.
func (e *env) instance(t *testing.T, id, state string) {
	e.h.Instance(t, id)
	disk := filepath.Join(e.h.InstancesDir(), id, vmruntime.DiskFile)
	if out, err := exec.Command("qemu-io", "-c", "write -P 0x5a 1M 64k", disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	ctx := context.Background()
	if _, err := e.rt.Ensure(ctx, vmruntime.InstanceMachine(id, 1, 64, e.h.Base, "qcow2", nil)); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.SetState(ctx, id, state); err != nil {
		t.Fatal(err)
	}
}

func (e *env) run(t *testing.T, cfg Config, id string, b body) (Result, error) {
	raw, _ := json.Marshal(b)
	out, err := NewKind(cfg).Run(dispatch.WithCommandID(context.Background(), id), raw)
	var res Result
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		t.Fatalf("result %s: %v", out, jerr)
	}
	return res, err
}

// TestSnapshotOnLibvirtd: on a real libvirtd, a running instance's
// memory and disk, and a paused one's disk alone, are uploaded once as
// one archive whose SHA-256 the result carries; the disk is flattened
// (no backing file) and keeps what was written to the overlay; the
// domains come back as they were, resumed from the saved memory; the
// staging is gone; progress was reported while uploading.
func TestSnapshotOnLibvirtd(t *testing.T) {
	e := newEnv(t)
	e.instance(t, "vm-a", vmruntime.Running)
	e.instance(t, "vm-p", vmruntime.Paused)
	var mu sync.Mutex
	var frames []map[string]any
	cfg := e.cfg
	cfg.Progress = func(_ context.Context, id string, v any) {
		mu.Lock()
		defer mu.Unlock()
		if id == "cmd-1" {
			frames = append(frames, v.(map[string]any))
		}
	}
	e.tg.slow = 40 * time.Millisecond
	res, err := e.run(t, cfg, "cmd-1", body{Instance: "vm-a", Memory: true, URL: e.tg.url()})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	sum := sha256.Sum256(e.tg.got)
	if !res.Uploaded || res.SHA256 != hex.EncodeToString(sum[:]) || res.Bytes != int64(len(e.tg.got)) || res.Target != e.tg.srv.URL || e.tg.putCount() != 1 {
		t.Fatalf("result %+v; the target got %d bytes, sha256 %x, in %d PUTs", res, len(e.tg.got), sum, e.tg.putCount())
	}
	m := members(t, e.tg.got)
	var man Manifest
	if err := json.Unmarshal(m[ManifestFile], &man); err != nil || man.Instance != "vm-a" || man.VCPUs != 1 || man.MemoryMiB != 64 || !man.Memory || man.CPU != HostCPU() {
		t.Errorf("manifest %s (%v)", m[ManifestFile], err)
	}
	if !bytes.HasPrefix(m[MemoryFile], []byte("LibvirtQemudSave")) {
		t.Errorf("no saved memory in the archive (%d bytes)", len(m[MemoryFile]))
	}
	checkDisk(t, e, m[DiskFile])
	if got, _ := e.h.D.Virsh(t, "domstate", "--reason", "vm-a"); strings.TrimSpace(got) != "running (restored)" {
		t.Errorf("vm-a after its snapshot: %q, want running (restored)", got)
	}
	mu.Lock()
	uploading := 0
	for _, f := range frames {
		if f["phase"] == "uploading" {
			uploading++
		}
	}
	mu.Unlock()
	if uploading == 0 {
		t.Errorf("no progress while uploading: %v", frames)
	}
	if left, _ := os.ReadDir(filepath.Join(e.h.Data, "snapshots")); len(left) != 0 {
		t.Errorf("staging left behind: %v", left)
	}
	if _, err := os.Lstat(filepath.Join(e.h.InstancesDir(), "vm-a", MemoryFile)); !os.IsNotExist(err) {
		t.Errorf("memory file left in the instance's directory: %v", err)
	}

	e.tg.slow = 0
	res, err = e.run(t, e.cfg, "cmd-2", body{Instance: "vm-p", URL: e.tg.url()})
	if err != nil || !res.Uploaded {
		t.Fatalf("disk snapshot of a paused instance: %+v, %v", res, err)
	}
	m = members(t, e.tg.got)
	if _, has := m[MemoryFile]; has || len(m) != 2 {
		t.Errorf("a disk snapshot has %d members, memory %v", len(m), has)
	}
	checkDisk(t, e, m[DiskFile])
	if got, _ := e.h.D.Virsh(t, "domstate", "vm-p"); strings.TrimSpace(got) != "paused" {
		t.Errorf("vm-p after its snapshot: %q, want paused", got)
	}
}

// checkDisk: the archive's disk is a qcow2 naming no backing file with
// the overlay's pattern.
func checkDisk(t *testing.T, e *env, disk []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.qcow2")
	if err := os.WriteFile(p, disk, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(e.h.QEMUImg, "info", "--output=json", p).Output()
	var info struct {
		Format  string `json:"format"`
		Backing string `json:"backing-filename"`
		Virtual int64  `json:"virtual-size"`
	}
	if err != nil || json.Unmarshal(out, &info) != nil || info.Format != "qcow2" || info.Backing != "" || info.Virtual != 64<<20 {
		t.Errorf("disk: %s (%v)", out, err)
	}
	if out, err := exec.Command("qemu-io", "-c", "read -P 0x5a 1M 64k", p).CombinedOutput(); err != nil || strings.Contains(string(out), "Pattern verification failed") {
		t.Errorf("the disk lost the overlay's bytes: %v: %s", err, out)
	}
}

// TestRefusals: a stopped instance has no memory, an http URL and an
// unknown instance are refused, an upload answered 403 fails naming only
// the target's scheme and host, a stalled upload ends within the window;
// none leaves staging behind.
func TestRefusals(t *testing.T) {
	e := newEnv(t)
	e.instance(t, "vm-s", vmruntime.Stopped)
	for _, tt := range []struct {
		name, want string
		b          body
		status     int
		stallAt    int
	}{
		{name: "memory of a stopped instance", want: "needs it RUNNING or PAUSED", b: body{Instance: "vm-s", Memory: true, URL: e.tg.url()}},
		{name: "http", want: "presigned https URL", b: body{Instance: "vm-s", URL: "http://127.0.0.1/x?sig=sekrit"}},
		{name: "no such instance", want: "no such domain", b: body{Instance: "vm-none", URL: e.tg.url()}},
		{name: "refused upload", want: "403 Forbidden", b: body{Instance: "vm-s", URL: e.tg.url()}, status: http.StatusForbidden},
		{name: "stalled", want: "transfer stalled", b: body{Instance: "vm-s", URL: e.tg.url()}, stallAt: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e.tg.mu.Lock()
			e.tg.status, e.tg.stallAt = tt.status, tt.stallAt
			e.tg.mu.Unlock()
			cfg := e.cfg
			cfg.Stall = stall.Rule{Window: 500 * time.Millisecond}
			start := time.Now()
			_, err := e.run(t, cfg, "cmd-"+tt.name, tt.b)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "sekrit") || strings.Contains(err.Error(), "/bucket") {
				t.Errorf("the error carries the URL past its host: %v", err)
			}
			if took := time.Since(start); tt.stallAt > 0 && took > 5*time.Second {
				t.Errorf("a stalled upload took %v to end (window 500ms)", took)
			}
			if left, _ := os.ReadDir(filepath.Join(e.h.Data, "snapshots")); len(left) != 0 {
				t.Errorf("staging left behind: %v", left)
			}
		})
	}
}

// The killed node: the test binary run again as a node whose dispatcher
// runs instance.snapshot, killed while it uploads.
const childEnv = "BCD_SNAPSHOT_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		child()
		return
	}
	os.Exit(m.Run())
}

type childArgs struct {
	Journal, Data, URI, CA, URL string
}

func child() {
	var a childArgs
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &a); err != nil {
		panic(err)
	}
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(a.CA)
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig(pool)}}
	rt := libvirtrt.New(libvirtrt.Config{URI: a.URI, InstancesDir: filepath.Join(a.Data, "instances")})
	j, _, err := journal.Open(a.Journal, "n1")
	if err != nil {
		panic(err)
	}
	d, err := dispatch.New(dispatch.Config{NodeID: "n1", Journal: j, Kinds: []dispatch.Kind{NewKind(Config{DataDir: a.Data, Runtime: rt, Client: client})}})
	if err != nil {
		panic(err)
	}
	if err := d.Recover(); err != nil {
		panic(err)
	}
	go d.Run(context.Background())
	if err := d.Deliver(snapshotCommand(a.URL)); err != nil {
		panic(err)
	}
	select {}
}

func snapshotCommand(url string) *bcdv1.Command {
	b, _ := json.Marshal(body{Instance: "vm-k", URL: url})
	return &bcdv1.Command{Id: "cmd-killed", NodeId: "n1", Kind: Kind, Body: b, DeadlineUnixMs: time.Now().Add(10 * time.Minute).UnixMilli()}
}

// TestKilledMidUpload: a node killed (SIGKILL) while it uploads, started
// again, reports one result for the command, INTERRUPTED, saying the
// upload was not made again; no second PUT reaches the target, also when
// the gateway delivers the command again; the staging is removed.
func TestKilledMidUpload(t *testing.T) {
	e := newEnv(t)
	e.instance(t, "vm-k", vmruntime.Stopped)
	e.tg.stallAt = 64 << 10
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: e.tg.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	jpath := filepath.Join(t.TempDir(), journal.File)
	args, _ := json.Marshal(childArgs{Journal: jpath, Data: e.h.Data, URI: e.h.ReadOnlyURI(), CA: ca, URL: e.tg.url()})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(args))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.tg.started:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the node never started uploading")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	j, _, err := journal.Open(jpath, "n1")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	var runs atomic.Int32
	k := NewKind(Config{DataDir: e.h.Data, Runtime: e.rt, Client: e.tg.srv.Client()})
	run := k.Run
	k.Run = func(ctx context.Context, b []byte) (json.RawMessage, error) { runs.Add(1); return run(ctx, b) }
	d, err := dispatch.New(dispatch.Config{NodeID: "n1", Journal: j, Kinds: []dispatch.Kind{k}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Recover(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go d.Run(ctx)
	if err := d.Deliver(snapshotCommand(e.tg.url())); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	var results []*bcdv1.CommandResult
	for _, r := range d.Unacked() {
		if r.GetCommandId() == "cmd-killed" {
			results = append(results, r)
		}
	}
	if len(results) != 1 {
		t.Fatalf("%d results for the killed command, want 1", len(results))
	}
	r := results[0]
	var res Result
	json.Unmarshal(r.GetOutput(), &res)
	if r.GetStatus() != dispatch.Interrupted || !strings.Contains(r.GetError(), "it was not uploaded again") || res.Phase != phaseUploading || res.Uploaded || res.SHA256 == "" {
		t.Errorf("result %s %q %s", r.GetStatus(), r.GetError(), r.GetOutput())
	}
	if n := e.tg.putCount(); n != 1 || runs.Load() != 0 {
		t.Errorf("%d PUTs and %d runs after the restart, want 1 and 0", n, runs.Load())
	}
	if left, _ := os.ReadDir(filepath.Join(e.h.Data, "snapshots")); len(left) != 0 {
		t.Errorf("staging left behind: %v", left)
	}
}

func tlsConfig(pool *x509.CertPool) *tls.Config { return &tls.Config{RootCAs: pool} }
