package instances

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/vm/images"
	"github.com/better-compute/bcd/components/vm/libvirtrt"
	"github.com/better-compute/bcd/components/vm/rootvirt/rootvirttest"
	"github.com/better-compute/bcd/components/vm/snapshot"
	"github.com/better-compute/bcd/components/vm/spec"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// TestMemoryRestoreOnLibvirtd: on a real libvirtd through the root half,
// instance.snapshot with memory of a running domain, PUT to an https
// server on loopback, is restored by the converger as a new instance
// (fetched back, unpacked, defined over the snapshot's disk, its memory
// resumed through libvirt.restore): the new domain is "running
// (restored)" with a UUID of its own, and its source runs on. A disk
// snapshot of the same source is then restored by a second node (its own
// data directory, root's data_dir and node for it its own) on the same
// libvirtd into another shape: a fresh boot over the snapshot's disk.
// Each node then runs its own instances beside the other's and lists,
// adopts and removes only its own: the first node's converger finds
// nothing to do while the second's instance runs, and removing every
// instance of the first leaves the second's running.
func TestMemoryRestoreOnLibvirtd(t *testing.T) {
	h := rootvirttest.New(t)
	var mu sync.Mutex
	stored := map[string][]byte{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Method == http.MethodPut {
			stored[r.URL.Path], _ = io.ReadAll(r.Body)
			return
		}
		w.Write(stored[r.URL.Path])
	}))
	t.Cleanup(srv.Close)
	ctx := context.Background()

	src := libvirtrt.New(libvirtrt.Config{URI: h.ReadOnlyURI(), InstancesDir: h.InstancesDir(), Helper: rootvirttest.RootHalf{Host: h.Root}, Signed: h.Signed})
	h.Instance(t, "vm-src")
	if _, err := src.Ensure(ctx, vmruntime.InstanceMachine("vm-src", 1, 64, h.Base, "qcow2", nil)); err != nil {
		t.Fatal(err)
	}
	if err := src.SetState(ctx, "vm-src", vmruntime.Running); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"instance": "vm-src", "memory": true, "url": srv.URL + "/snap.tar?sig=x"})
	out, err := snapshot.NewKind(snapshot.Config{DataDir: h.Data, Runtime: src, Client: srv.Client(), QEMUImg: h.QEMUImg}).Run(dispatch.WithCommandID(ctx, "c1"), body)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	var res snapshot.Result
	json.Unmarshal(out, &res)

	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	store, err := images.New(images.Config{Dir: filepath.Join(h.Data, "images"), Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := images.New(images.Config{Dir: filepath.Join(h.Data, "snapshots"), Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	var s *Section
	rt := libvirtrt.New(libvirtrt.Config{URI: h.ReadOnlyURI(), InstancesDir: h.InstancesDir(), Helper: rootvirttest.RootHalf{Host: h.Root},
		Signed: func(m vmruntime.Machine) ([]byte, rootsig.Proof, error) { return s.Signed(m) }})
	s = New(Config{Dir: h.InstancesDir(), Runtime: rt, Images: store, Snapshots: snaps})
	// vm-src stays in the section: the section is the whole desired set.
	sec := spec.Body{
		Images: []spec.Image{{SHA256: h.Base, URL: "https://img.example/b.qcow2", Format: "qcow2"}},
		Instances: []spec.Instance{
			{ID: "vm-src", Allocation: "a", State: vmruntime.Running, VCPUs: 1, MemoryMiB: 64, Image: h.Base},
			{ID: "vm-new", Allocation: "a", State: vmruntime.Running, VCPUs: 1, MemoryMiB: 64,
				RestoreFrom: &spec.Restore{URL: srv.URL + "/snap.tar", SHA256: res.SHA256, Memory: true}},
		}}
	raw, _ := json.Marshal(sec)
	full := map[string]json.RawMessage{"instances": raw}
	digests, err := rootsig.SectionDigests(full)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	s.HeldProof(rootsig.Proof{NodeID: "n", Generation: 1, SpecSHA256: sum[:], Sections: digests})
	// A disk snapshot of the same source, for the second node below.
	body, _ = json.Marshal(map[string]any{"instance": "vm-src", "url": srv.URL + "/disk.tar"})
	out, err = snapshot.NewKind(snapshot.Config{DataDir: h.Data, Runtime: src, Client: srv.Client(), QEMUImg: h.QEMUImg}).Run(dispatch.WithCommandID(ctx, "c2"), body)
	if err != nil {
		t.Fatalf("disk snapshot: %v", err)
	}
	var disk snapshot.Result
	json.Unmarshal(out, &disk)
	convergeAll(t, s, raw)
	for id, want := range map[string]string{"vm-new": "running (restored)", "vm-src": "running (restored)"} {
		if got, _ := h.D.Virsh(t, "domstate", "--reason", id); strings.TrimSpace(got) != want {
			t.Errorf("%s: %q, want %q", id, strings.TrimSpace(got), want)
		}
	}
	// Its own SSH host identity: a fresh key on a read-only vdz.
	if got, _ := h.D.Virsh(t, "domblklist", "vm-new"); !strings.Contains(got, "vdz") || !strings.Contains(got, IdentityFile) {
		t.Errorf("vm-new has no identity disk:\n%s", got)
	}
	if got, _ := h.D.Virsh(t, "domblklist", "vm-src"); strings.Contains(got, "vdz") {
		t.Errorf("vm-src got an identity disk:\n%s", got)
	}
	if iso, err := os.ReadFile(filepath.Join(h.InstancesDir(), "vm-new", IdentityFile)); err != nil || !strings.Contains(string(iso), "ed25519_public: ssh-ed25519 ") {
		t.Errorf("identity disk: %v", err)
	}
	if uuid := func(id string) string { o, _ := h.D.Virsh(t, "domuuid", id); return o }; uuid("vm-new") == uuid("vm-src") {
		t.Error("the restored instance has its source's UUID")
	}

	// A second node, with its own data directory (and root's data_dir
	// and node for it), restores the disk snapshot beside the first
	// node's running domains.
	data2 := filepath.Join(h.D.Dir, "data2")
	root2 := h.Root
	root2.DataDir, root2.Node = data2, "node_two"
	store2, err := images.New(images.Config{Dir: filepath.Join(data2, "images"), Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	snaps2, err := images.New(images.Config{Dir: filepath.Join(data2, "snapshots"), Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	var s2 *Section
	rt2 := libvirtrt.New(libvirtrt.Config{URI: h.ReadOnlyURI(), InstancesDir: filepath.Join(data2, "instances"), Helper: rootvirttest.RootHalf{Host: root2},
		Signed: func(m vmruntime.Machine) ([]byte, rootsig.Proof, error) { return s2.Signed(m) }})
	s2 = New(Config{Dir: filepath.Join(data2, "instances"), Runtime: rt2, Images: store2, Snapshots: snaps2})
	raw2, _ := json.Marshal(spec.Body{Instances: []spec.Instance{{ID: "vm-second", Allocation: "b", State: vmruntime.Running, VCPUs: 2, MemoryMiB: 128,
		RestoreFrom: &spec.Restore{URL: srv.URL + "/disk.tar", SHA256: disk.SHA256}}}})
	digests2, _ := rootsig.SectionDigests(map[string]json.RawMessage{"instances": raw2})
	sum2 := sha256.Sum256(raw2)
	s2.HeldProof(rootsig.Proof{NodeID: "n2", Generation: 1, SpecSHA256: sum2[:], Sections: digests2})
	convergeAll(t, s2, raw2)
	if got, _ := h.D.Virsh(t, "domstate", "--reason", "vm-second"); strings.TrimSpace(got) != "running (booted)" {
		t.Errorf("vm-second: %q, want running (booted)", strings.TrimSpace(got))
	}
	if x, _ := h.D.Virsh(t, "dumpxml", "vm-second"); !strings.Contains(x, filepath.Join(data2, "instances", "vm-second", "disk.qcow2")) {
		t.Errorf("vm-second's disk is not in the second node's directory:\n%s", x)
	}
	ids := func(rt *libvirtrt.Runtime) string {
		l, err := rt.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range l {
			ids = append(ids, fmt.Sprintf("%s:%v", d.ID, d.Owned))
		}
		return strings.Join(ids, " ")
	}
	if got := ids(rt); got != "vm-new:true vm-src:true" {
		t.Errorf("the first node lists %q, want its own two", got)
	}
	if got := ids(rt2); got != "vm-second:true" {
		t.Errorf("the second node lists %q, want its own one", got)
	}
	if p, err := s.Plan(ctx, raw); err != nil || len(p.Changes) != 0 {
		t.Errorf("the first node's plan beside the second's instance: %v, %v; want nothing to do", p.Changes, err)
	}
	// The first node removes every instance of its own; the second's runs on.
	raw1, _ := json.Marshal(spec.Body{})
	convergeAll(t, s, raw1)
	for id, want := range map[string]string{"vm-second": "running (booted)", "vm-src": "", "vm-new": ""} {
		got, _ := h.D.Virsh(t, "domstate", "--reason", id)
		if strings.TrimSpace(got) != want {
			t.Errorf("%s after the first node emptied its section: %q, want %q", id, strings.TrimSpace(got), want)
		}
	}
	if p, err := s2.Plan(ctx, raw2); err != nil || len(p.Changes) != 0 {
		t.Errorf("the second node's plan: %v, %v; want nothing to do", p.Changes, err)
	}
}

// convergeAll plans and applies raw on s until a plan finds nothing to do.
func convergeAll(t *testing.T, s *Section, raw []byte) {
	t.Helper()
	ctx := context.Background()
	end := time.Now().Add(60 * time.Second)
	for {
		p, err := s.Plan(ctx, raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Changes) == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("not converged: %v; last Apply: %v", p.Changes, s.Apply(ctx, raw, p))
		}
		if err := s.Apply(ctx, raw, p); err != nil && !strings.Contains(err.Error(), "fetching") {
			t.Fatalf("Apply: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
