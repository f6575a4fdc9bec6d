// Package rootvirttest is a VPS host for tests of the node's side: a
// real libvirtd (libvirttest), a node data directory with a qcow2 base
// image, and RootHalf, which stands in for the transport to bcd helper
// (each request through wire's encoding and strict decoding onto the
// real root half, rootvirt, as root). The proof's admission is the
// helper's, tested in components/helper and end to end. Linked only by
// tests.
package rootvirttest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/vm/libvirttest"
	"github.com/better-compute/bcd/components/vm/rootvirt"
	"github.com/better-compute/bcd/components/vm/seed"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// RootHalf runs libvirt.* requests on rootvirt as root.
type RootHalf struct{ Host helper.LibvirtHost }

// Do sends req through wire's encoding and the helper's checks to
// rootvirt.
func (h RootHalf) Do(ctx context.Context, req *wire.Request) (*wire.Response, error) {
	b, err := wire.EncodeRequest(req)
	if err != nil {
		return nil, err
	}
	got, err := wire.DecodeRequest(b)
	if err != nil {
		return nil, err
	}
	if err := got.Check(); err != nil {
		return nil, err
	}
	var final bool
	switch got.Op {
	case wire.OpLibvirtDefine:
		final, err = rootvirt.Ops{}.Define(ctx, h.Host, got.ID, got.Section)
	case wire.OpLibvirtRestore:
		final, err = rootvirt.Ops{}.Restore(ctx, h.Host, got.ID, got.Section)
	default:
		final, err = rootvirt.Ops{}.Act(ctx, h.Host, got.Op, got.ID)
	}
	if err != nil {
		return wire.Failed(err.Error(), !final), &helperclient.Error{Op: got.Op, Msg: err.Error(), Retryable: !final}
	}
	return &wire.Response{OK: true}, nil
}

// Host is one libvirtd with a node data directory (files of the test's
// own uid, root) and a 64 MiB qcow2 base image.
type Host struct {
	D       *libvirttest.Daemon
	QEMUImg string
	Data    string
	// Base is the base image's SHA-256; BasePath its file.
	Base, BasePath string
	Root           helper.LibvirtHost
}

// New starts the host for t.
func New(t *testing.T) *Host {
	t.Helper()
	d := libvirttest.Start(t)
	h := &Host{D: d, QEMUImg: testenv.NeedTool(t, "qemu-img", "qemu-utils"), Data: filepath.Join(d.Dir, "data")}
	images := filepath.Join(h.Data, "images")
	if err := os.MkdirAll(images, 0o750); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(images, "tmp")
	h.QEMU(t, "create", "-q", "-f", "qcow2", tmp, "64M")
	b, err := os.ReadFile(tmp)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	h.Base = hex.EncodeToString(sum[:])
	h.BasePath = filepath.Join(images, h.Base+".qcow2")
	if err := os.Rename(tmp, h.BasePath); err != nil {
		t.Fatal(err)
	}
	h.Root = helper.LibvirtHost{DataDir: h.Data, Owner: uint32(os.Getuid()), Node: "node_one", Accel: libvirttest.Accel(), Staging: filepath.Join(d.Dir, "root-staging"),
		Virsh: func(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
			var out, errb bytes.Buffer
			cmd := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", d.URI()}, args...)...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errb
			if err := cmd.Run(); err != nil {
				return out.Bytes(), fmt.Errorf("virsh %s: %w: %s", args[0], err, strings.TrimSpace(errb.String()))
			}
			return out.Bytes(), nil
		}}
	return h
}

// QEMU runs qemu-img with args.
func (h *Host) QEMU(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(h.QEMUImg, args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
}

// ReadOnlyURI is libvirtd's read-only connection, as a node reads it.
func (h *Host) ReadOnlyURI() string { return "qemu:///system?socket=" + h.D.ReadOnlySocket() }

// InstancesDir is data_dir/instances.
func (h *Host) InstancesDir() string { return filepath.Join(h.Data, "instances") }

// Instance lays out id's directory as the converger does: an overlay of
// the base and a seed.
func (h *Host) Instance(t *testing.T, id string) {
	t.Helper()
	dir := filepath.Join(h.InstancesDir(), id)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	h.QEMU(t, "create", "-q", "-f", "qcow2", "-b", h.BasePath, "-F", "qcow2", filepath.Join(dir, vmruntime.DiskFile))
	if err := seed.WriteFile(filepath.Join(dir, vmruntime.SeedFile), seed.Seed{InstanceID: id}); err != nil {
		t.Fatal(err)
	}
}

// Signed is an instances section naming m over the base, with a proof
// (the runtime's Config.Signed).
func (h *Host) Signed(m vmruntime.Machine) ([]byte, rootsig.Proof, error) {
	section := []byte(fmt.Sprintf(`{"images":[{"sha256":%q,"url":"https://img.example/b.qcow2","format":"qcow2"}],"instances":[{"id":%q,"allocation":"a","state":"STOPPED","vcpus":%d,"memory_mib":%d,"image":%q}]}`,
		h.Base, m.ID, m.VCPUs, m.MemoryMiB, h.Base))
	full := map[string]json.RawMessage{"instances": section}
	digests, err := rootsig.SectionDigests(full)
	raw, _ := json.Marshal(full)
	sum := sha256.Sum256(raw)
	return section, rootsig.Proof{NodeID: "node_a", Generation: 1, SpecSHA256: sum[:], Sections: digests}, err
}
