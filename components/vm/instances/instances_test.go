package instances

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/base/stall"
	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/vm/fakeruntime"
	"github.com/better-compute/bcd/components/vm/images"
	"github.com/better-compute/bcd/components/vm/spec"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// host is one test node: an image server on loopback, a store, the
// file-backed runtime, the section and the events it raised.
type host struct {
	t       *testing.T
	dir     string
	srv     *httptest.Server
	files   map[string][]byte
	store   *images.Store
	rt      *fakeruntime.Runtime
	s       *Section
	events  []string
	qemuImg string
	// gate, when set, holds every download until it is closed.
	gate chan struct{}
	// published is the last role report the section published.
	published Report
	// stalled is a path the server sends half of, then nothing more.
	stalled string
	quit    chan struct{}
	snaps   *images.Store
}

func newHost(t *testing.T) *host {
	h := &host{t: t, dir: t.TempDir(), files: map[string][]byte{}, quit: make(chan struct{})}
	h.qemuImg = testenv.NeedTool(t, "qemu-img", "qemu-utils")
	h.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.gate != nil {
			<-h.gate
		}
		b, ok := h.files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.URL.Path == h.stalled {
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.Write(b[:len(b)/2])
			w.(http.Flusher).Flush()
			<-h.quit
			return
		}
		w.Write(b)
	}))
	t.Cleanup(h.srv.Close)
	t.Cleanup(func() { close(h.quit) })
	h.restart()
	return h
}

// restart makes new values over the same directories, as a restarted
// bcd node would.
func (h *host) restart() {
	roots := x509.NewCertPool()
	roots.AddCert(h.srv.Certificate())
	var err error
	if h.store, err = images.New(images.Config{Dir: filepath.Join(h.dir, "images"), Roots: roots}); err != nil {
		h.t.Fatal(err)
	}
	if h.snaps, err = images.New(images.Config{Dir: filepath.Join(h.dir, "snapshots"), Roots: roots, Stall: stall.Rule{Window: 500 * time.Millisecond}}); err != nil {
		h.t.Fatal(err)
	}
	if h.rt, err = fakeruntime.New(filepath.Join(h.dir, "runtime"), func() (string, error) { return "boot-1", nil }); err != nil {
		h.t.Fatal(err)
	}
	h.s = New(Config{Dir: filepath.Join(h.dir, "instances"), Runtime: h.rt, Images: h.store, Snapshots: h.snaps,
		UserData: func(_ context.Context, in spec.Instance) ([]byte, error) {
			return []byte("#cloud-config\n# user data of " + in.Allocation + "\n"), nil
		},
		Event: func(typ string, body any) {
			b, _ := json.Marshal(body)
			h.events = append(h.events, typ+" "+string(b))
		}})
	h.s.SetPublish(func(b []byte) {
		var r map[string]Report
		if err := json.Unmarshal(b, &r); err != nil {
			h.t.Errorf("published %s: %v", b, err)
		}
		h.published = r["instances"]
	})
}

// image serves b at path and returns its section entry.
func (h *host) image(path, format string, b []byte) spec.Image {
	h.files[path] = b
	sum := sha256.Sum256(b)
	return spec.Image{SHA256: hex.EncodeToString(sum[:]), URL: h.srv.URL + path, Format: format}
}

func (h *host) qcow2(args ...string) []byte {
	p := filepath.Join(h.t.TempDir(), "img")
	if out, err := exec.Command(h.qemuImg, append(append([]string{"create", "-q", "-f", "qcow2"}, args...), p)...).CombinedOutput(); err != nil {
		h.t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(p)
	return b
}

// pass plans and applies body as the engine would, again while an image
// is being fetched in the background, and returns the last Apply's error
// and what a plan after it still finds.
func (h *host) pass(b spec.Body) (error, []string) {
	h.t.Helper()
	body, _ := json.Marshal(b)
	ctx := context.Background()
	for i := 0; ; i++ {
		p, err := h.s.Plan(ctx, body)
		if err != nil {
			h.t.Fatalf("Plan: %v", err)
		}
		if len(p.Changes) == 0 {
			return nil, nil
		}
		aerr := h.s.Apply(ctx, body, p)
		p2, err := h.s.Plan(ctx, body)
		if err != nil {
			h.t.Fatalf("Plan after Apply: %v", err)
		}
		// Done once a pass began with no fetch to wait for.
		fetching := slices.ContainsFunc(p.Changes, func(c string) bool {
			return strings.Contains(c, ": fetch image") || strings.Contains(c, ": fetch snapshot")
		})
		if !fetching || i == 500 {
			return aerr, p2.Changes
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *host) domains() map[string]vmruntime.Domain {
	l, err := h.rt.List(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	m := map[string]vmruntime.Domain{}
	for _, d := range l {
		m[d.ID] = d
	}
	return m
}

func inst(id, state string, im spec.Image) spec.Instance {
	return spec.Instance{ID: id, Allocation: "alloc_" + id, State: state, VCPUs: 1, MemoryMiB: 128, Image: im.SHA256}
}

// TestConverges: two instances from a qcow2 base and one from an iso
// converge in one pass and stay converged across a restart; states
// change; a removed instance is destroyed with its directory, and its
// image goes once no instance names it.
func TestConverges(t *testing.T) {
	h := newHost(t)
	base := h.image("/debian.qcow2", "qcow2", h.qcow2("-o", "size=64M"))
	iso := h.image("/install.iso", "iso", []byte(strings.Repeat("iso", 1000)))
	a, b, c := inst("vm-a", vmruntime.Running, base), inst("vm-b", vmruntime.Paused, base), inst("vm-c", vmruntime.Stopped, iso)
	a.UserData, a.DiskGiB = true, 1
	c.DiskGiB = 1
	body := spec.Body{Images: []spec.Image{base, iso}, Instances: []spec.Instance{a, b, c}}
	if err, left := h.pass(body); err != nil || len(left) != 0 {
		t.Fatalf("Apply = %v, then plan %v; want converged", err, left)
	}
	d := h.domains()
	if len(d) != 3 || d["vm-a"].State != vmruntime.Running || d["vm-b"].State != vmruntime.Paused || d["vm-c"].State != vmruntime.Stopped {
		t.Fatalf("domains %+v", d)
	}
	info, err := exec.Command(h.qemuImg, "info", "--output=json", filepath.Join(h.dir, "instances", "vm-a", DiskFile)).Output()
	if err != nil {
		t.Fatal(err)
	}
	var qi struct {
		Backing     string `json:"backing-filename"`
		VirtualSize int64  `json:"virtual-size"`
	}
	json.Unmarshal(info, &qi)
	if qi.Backing != filepath.Join(h.dir, "images", base.SHA256+".qcow2") || qi.VirtualSize != 1<<30 {
		t.Errorf("vm-a's disk: %+v; want a 1 GiB overlay of its base", qi)
	}
	sd, _ := os.ReadFile(filepath.Join(h.dir, "instances", "vm-a", SeedFile))
	if !bytes.Contains(sd, []byte("user data of alloc_vm-a")) || !bytes.Contains(sd, []byte("cidata")) {
		t.Error("vm-a's seed lacks its user data")
	}
	h.restart()
	if err, left := h.pass(body); err != nil || len(left) != 0 {
		t.Fatalf("after a restart: Apply = %v, then plan %v", err, left)
	}

	body.Instances[0].State = vmruntime.Paused
	body.Instances[1].State = vmruntime.Stopped
	if err, left := h.pass(body); err != nil || len(left) != 0 {
		t.Fatalf("state change: %v, %v", err, left)
	}
	if d := h.domains(); d["vm-a"].State != vmruntime.Paused || d["vm-b"].State != vmruntime.Stopped {
		t.Errorf("after the state change: %+v", d)
	}

	body.Instances = body.Instances[:2]
	if err, left := h.pass(body); err != nil || len(left) != 0 {
		t.Fatalf("removal: %v, %v", err, left)
	}
	if _, ok := h.domains()["vm-c"]; ok {
		t.Error("vm-c's domain is still there")
	}
	if _, err := os.Stat(filepath.Join(h.dir, "instances", "vm-c")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("vm-c's directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "images", iso.SHA256+".iso")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the iso no instance names: %v", err)
	}
	body.Instances = body.Instances[:1]
	if err, _ := h.pass(body); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "images", base.SHA256+".qcow2")); err != nil {
		t.Errorf("the base vm-a still names: %v", err)
	}
	if err, left := h.pass(spec.Body{}); err != nil || len(left) != 0 || len(h.domains()) != 0 {
		t.Errorf("an empty section: %v, %v, %+v", err, left, h.domains())
	}
	if len(h.events) != 0 {
		t.Errorf("events %v", h.events)
	}
}

// TestFailsAlone: an instance named like a domain bcd did not create, one
// whose image's SHA-256 differs, one whose image names /etc/shadow, one
// asking for user data on a node that cannot fetch it and one whose disk
// was swapped for an overlay of /etc/shadow each fail alone, once each
// in InstanceFailed, the section FAILED (terminal); the good instance
// converges and the foreign domain is untouched.
func TestFailsAlone(t *testing.T) {
	h := newHost(t)
	base := h.image("/debian.qcow2", "qcow2", h.qcow2("-o", "size=64M"))
	bad := h.image("/bad.qcow2", "qcow2", []byte("what was pinned"))
	h.files["/bad.qcow2"] = []byte("what is served")
	shadow := h.image("/shadow.qcow2", "qcow2", h.qcow2("-u", "-b", "/etc/shadow", "-F", "raw", "-o", "size=64M"))
	foreign, _ := json.Marshal(fakeruntime.Record{Machine: vmruntime.Machine{ID: "byhand"}, State: vmruntime.Running, BootID: "boot-1"})
	os.WriteFile(filepath.Join(h.dir, "runtime", "byhand.json"), foreign, 0o600)

	good, swapped := inst("good", vmruntime.Running, base), inst("swapped", vmruntime.Running, base)
	ud := inst("ud", vmruntime.Running, base)
	ud.UserData = true
	body := spec.Body{Images: []spec.Image{base, bad, shadow}, Instances: []spec.Instance{
		good, swapped, inst("byhand", vmruntime.Running, base), inst("digest", vmruntime.Running, bad), inst("shadow", vmruntime.Running, shadow), ud}}
	h.s.cfg.UserData = nil
	if err, _ := h.pass(spec.Body{Images: body.Images, Instances: body.Instances[:2]}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.dir, "instances", "swapped", DiskFile), h.qcow2("-u", "-b", "/etc/shadow", "-F", "raw", "-o", "size=64M"), 0o660); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		err, _ := h.pass(body)
		if err == nil || !converge.IsTerminal(err) || !strings.Contains(err.Error(), "5 of 6 instances failed") {
			t.Fatalf("Apply = %v; want 5 of 6 failed, terminal", err)
		}
	}
	d := h.domains()
	if d["good"].State != vmruntime.Running || d["byhand"].Owned || d["byhand"].State != vmruntime.Running {
		t.Errorf("domains %+v", d)
	}
	for _, id := range []string{"digest", "shadow", "ud"} {
		if _, ok := d[id]; ok {
			t.Errorf("%s was defined", id)
		}
	}
	want := map[string]string{
		"byhand": "a domain bcd did not create", "digest": "has SHA-256", "shadow": `"/etc/shadow"`,
		"swapped": "instance disk refused", "ud": "user data is not fetched",
	}
	// The role report lists every domain, the hand-made one as not bcd's,
	// and every failure.
	r := h.published
	if !r.Complete || len(r.Domains) != 3 || len(r.Failed) != len(want) {
		t.Errorf("report %+v", r)
	}
	for _, d := range r.Domains {
		if d.Owned == (d.ID == "byhand") || d.State != vmruntime.Running {
			t.Errorf("report lists %+v", d)
		}
	}
	for id, why := range want {
		if !strings.Contains(r.Failed[id], why) {
			t.Errorf("report: %s failed %q, want %q", id, r.Failed[id], why)
		}
	}
	if len(h.events) != len(want) {
		t.Errorf("events %v; want one per failed instance", h.events)
	}
	for _, e := range h.events {
		var body struct{ Instance, Reason string }
		json.Unmarshal([]byte(strings.TrimPrefix(e, "InstanceFailed ")), &body)
		if !strings.HasPrefix(e, "InstanceFailed ") || !strings.Contains(body.Reason, want[body.Instance]) {
			t.Errorf("event %s", e)
		}
	}
}

// TestNoRuntime: a host without a runtime fails a section naming an
// instance, and converges an empty one.
func TestNoRuntime(t *testing.T) {
	h := newHost(t)
	h.s.cfg.Runtime = nil
	base := h.image("/debian.qcow2", "qcow2", []byte("x"))
	body, _ := json.Marshal(spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{inst("vm-a", vmruntime.Running, base)}})
	if _, err := h.s.Plan(context.Background(), body); !converge.IsTerminal(err) || !strings.Contains(err.Error(), "no instance runtime") {
		t.Errorf("Plan = %v", err)
	}
	if p, err := h.s.Plan(context.Background(), nil); err != nil || len(p.Changes) != 0 {
		t.Errorf("Plan of no section = %+v, %v", p, err)
	}
}

// TestInterruptedDiskCreation: a disk creation a crash cut short leaves
// only its temporary file, which the next pass replaces; the instance
// converges with one domain.
func TestInterruptedDiskCreation(t *testing.T) {
	h := newHost(t)
	base := h.image("/debian.qcow2", "qcow2", h.qcow2("-o", "size=64M"))
	dir := filepath.Join(h.dir, "instances", "vm-a")
	os.MkdirAll(dir, 0o750)
	os.WriteFile(filepath.Join(dir, DiskFile+".new"), []byte("half a disk"), 0o660)
	body := spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{inst("vm-a", vmruntime.Running, base)}}
	if err, left := h.pass(body); err != nil || len(left) != 0 || len(h.domains()) != 1 {
		t.Fatalf("Apply = %v, then %v, domains %+v", err, left, h.domains())
	}
	if _, err := os.Stat(filepath.Join(dir, DiskFile+".new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary disk is left: %v", err)
	}
}

// TestFetchInBackground: while a base image downloads, Apply returns at
// once (the sections after this one do not wait) and Plan still finds
// the fetch, so the section stays PROGRESSING; once the download ends,
// the instance converges.
func TestFetchInBackground(t *testing.T) {
	h := newHost(t)
	base := h.image("/debian.qcow2", "qcow2", h.qcow2("-o", "size=64M"))
	h.gate = make(chan struct{})
	body, _ := json.Marshal(spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{inst("vm-a", vmruntime.Running, base)}})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		p, err := h.s.Plan(ctx, body)
		if err != nil || !slices.Contains(p.Changes, "vm-a: fetch image "+base.SHA256) {
			t.Fatalf("Plan = %v, %v; want the fetch", p.Changes, err)
		}
		if err := h.s.Apply(ctx, body, p); err != nil {
			t.Fatalf("Apply while fetching = %v, want nil (PROGRESSING)", err)
		}
	}
	if len(h.domains()) != 0 {
		t.Fatal("a domain was defined before its image arrived")
	}
	close(h.gate)
	if err, left := h.pass(spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{inst("vm-a", vmruntime.Running, base)}}); err != nil || len(left) != 0 {
		t.Fatalf("after the download: %v, %v", err, left)
	}
	if d := h.domains(); d["vm-a"].State != vmruntime.Running {
		t.Errorf("domains %+v", d)
	}
}

// TestTamperedDiskFound: a disk swapped under a converged instance, with
// nothing else to change, is found by Plan and fails the instance.
func TestTamperedDiskFound(t *testing.T) {
	h := newHost(t)
	base := h.image("/debian.qcow2", "qcow2", h.qcow2("-o", "size=64M"))
	b := spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{inst("vm-a", vmruntime.Running, base)}}
	if err, left := h.pass(b); err != nil || len(left) != 0 {
		t.Fatalf("%v, %v", err, left)
	}
	disk := filepath.Join(h.dir, "instances", "vm-a", DiskFile)
	if err := os.WriteFile(disk, h.qcow2("-u", "-b", "/etc/shadow", "-F", "raw", "-o", "size=64M"), 0o660); err != nil {
		t.Fatal(err)
	}
	err, left := h.pass(b)
	if !converge.IsTerminal(err) || !strings.Contains(err.Error(), "instance disk refused") || !slices.Contains(left, "vm-a: disk refused") {
		t.Errorf("after the swap: %v, %v", err, left)
	}
}

// TestGPUs: an instance with a GPU this host does not have, or one a
// hold has, fails alone; one with a free GPU of this host converges, and
// InVM then names it for the devices section.
func TestGPUs(t *testing.T) {
	h := newHost(t)
	const free, held = "GPU-AAAAAAAA-0000", "GPU-bbbbbbbb-0000"
	h.s.cfg.GPUs = func(context.Context) ([]string, error) { return []string{free, held}, nil }
	h.s.cfg.HeldBy = func(u string) string {
		if strings.EqualFold(u, held) {
			return "alloc_hold"
		}
		return ""
	}
	base := h.image("/debian.qcow2", "qcow2", h.qcow2("-o", "size=64M"))
	a, b, c := inst("vm-a", vmruntime.Running, base), inst("vm-b", vmruntime.Running, base), inst("vm-c", vmruntime.Running, base)
	a.GPUs, b.GPUs, c.GPUs = []string{"GPU-aaaaaaaa-0000"}, []string{held}, []string{"GPU-cccccccc-0000"}
	err, _ := h.pass(spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{a, b, c}})
	if !converge.IsTerminal(err) || !strings.Contains(err.Error(), "vm-b: resources-exhausted: GPU "+held+" is held by alloc_hold") ||
		!strings.Contains(err.Error(), "vm-c: GPU GPU-cccccccc-0000 is not on this host") || strings.Contains(err.Error(), "vm-a") {
		t.Fatalf("Apply = %v", err)
	}
	if d := h.domains(); len(d) != 1 || d["vm-a"].State != vmruntime.Running {
		t.Errorf("domains %+v, want vm-a alone", d)
	}
	if got := h.s.InVM(free); got != "vm-a" {
		t.Errorf("InVM(%s) = %q, want vm-a", free, got)
	}
	// A restarted node knows it before its first pass: the devices
	// section converges first.
	h.restart()
	if got := h.s.InVM(free); got != "vm-a" {
		t.Errorf("after a restart, InVM(%s) = %q, want vm-a", free, got)
	}
	if got := h.s.InVM(held); got != "" {
		t.Errorf("InVM(%s) = %q, want none", held, got)
	}
}

// TestNetworkPolicy: an instance with a NIC is ensured only once the
// network policy loaded: one the policy could not express fails alone,
// none runs when nothing loaded or this host loads no policy, and an
// instance without a NIC is not held back.
func TestNetworkPolicy(t *testing.T) {
	h := newHost(t)
	base := h.image("/debian.qcow2", "qcow2", h.qcow2("-o", "size=64M"))
	nic := func(in spec.Instance, mac, addr string) spec.Instance {
		in.NICs = []netpolicy.NIC{{Bridge: "br0", MAC: mac, Addresses: []string{addr}, Policy: netpolicy.Private}}
		return in
	}
	body := spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{
		nic(inst("guarded", vmruntime.Running, base), "52:54:00:00:00:01", "10.9.0.5/24"),
		nic(inst("hostaddr", vmruntime.Running, base), "52:54:00:00:00:02", "10.9.0.1/24"),
		inst("plain", vmruntime.Running, base)}}

	// No network policy on this host (no helper): instances with a NIC
	// fail, terminal; the plain one runs.
	if err, _ := h.pass(body); err == nil || !converge.IsTerminal(err) || !strings.Contains(err.Error(), "2 of 3") {
		t.Fatalf("without a network policy: %v", err)
	}
	if d := h.domains(); len(d) != 1 || d["plain"].State != vmruntime.Running {
		t.Fatalf("domains %+v", d)
	}

	var loaded []string
	loadErr := errors.New("nft: netlink: Operation not permitted")
	h.s.cfg.Network = func(_ context.Context, b []byte, p rootsig.Proof) (map[string]string, error) {
		loaded = append(loaded, p.NodeID)
		if loadErr != nil {
			return nil, loadErr
		}
		return map[string]string{"hostaddr": "nics[0]: address 10.9.0.1 is the host bridge br0's own"}, nil
	}
	h.s.HeldProof(rootsig.Proof{NodeID: "node_a"})
	if err, _ := h.pass(body); err == nil || converge.IsTerminal(err) || !strings.Contains(err.Error(), "Operation not permitted") {
		t.Fatalf("when the policy could not load: %v", err)
	}
	if d := h.domains(); len(d) != 1 {
		t.Fatalf("an instance with a NIC started without its policy: %+v", d)
	}
	loadErr = nil
	err, _ := h.pass(body)
	if err == nil || !strings.Contains(err.Error(), "1 of 3") || !strings.Contains(h.published.Failed["hostaddr"], "host bridge br0's own") {
		t.Fatalf("with the policy loaded: %v %v", err, h.published.Failed)
	}
	if d := h.domains(); d["guarded"].State != vmruntime.Running || len(d) != 2 {
		t.Fatalf("domains %+v", d)
	}
	if len(loaded) == 0 || loaded[0] != "node_a" {
		t.Fatalf("the policy was loaded with proofs %v", loaded)
	}
}

// TestBusyLeftAlone: an instance a snapshot holds is left as it is, in
// its state and on the host even when the section drops it, while the
// snapshot runs; then the pass goes on (without the busy check the
// STOPPED domain would be started, tried once).
func TestBusyLeftAlone(t *testing.T) {
	h := newHost(t)
	base := h.image("/debian.qcow2", "qcow2", h.qcow2("-o", "size=64M"))
	if err, _ := h.pass(spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{inst("vm-a", vmruntime.Stopped, base), inst("vm-b", vmruntime.Stopped, base)}}); err != nil {
		t.Fatal(err)
	}
	busy := true
	h.s.cfg.Busy = func(id string) bool { return busy && id != "vm-c" }
	ctx := context.Background()
	body, _ := json.Marshal(spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{inst("vm-a", vmruntime.Running, base)}})
	p, err := h.s.Plan(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.s.Apply(ctx, body, p); err != nil {
		t.Fatalf("Apply with busy instances = %v, want nil (PROGRESSING)", err)
	}
	if d := h.domains(); d["vm-a"].State != vmruntime.Stopped || d["vm-b"].ID == "" {
		t.Fatalf("busy instances touched: %+v", d)
	}
	busy = false
	if err, left := h.pass(spec.Body{Images: []spec.Image{base}, Instances: []spec.Instance{inst("vm-a", vmruntime.Running, base)}}); err != nil || len(left) != 0 {
		t.Fatalf("once released: %v, %v", err, left)
	}
	if d := h.domains(); d["vm-a"].State != vmruntime.Running || d["vm-b"].ID != "" {
		t.Errorf("once released: %+v", d)
	}
}
