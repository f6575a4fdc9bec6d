package rootvirt

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/seed"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// testSaveAndResume: libvirt.save stops a running domain with its memory
// in root's staging directory and a copy, the node's, in the instance's
// directory (a symlink the node left there is replaced, its target
// untouched); libvirt.start resumes it from root's copy ("restored"),
// not booted again. A domain that is not running has nothing to save.
func testSaveAndResume(t *testing.T, e *env) {
	ctx := context.Background()
	e.instance(t, "vm-s")
	if _, err := (Ops{}).Define(ctx, e.host, "vm-s", e.section("", "vm-s")); err != nil {
		t.Fatal(err)
	}
	if final, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtSave, "vm-s"); err == nil || !final || !strings.Contains(err.Error(), "only a running or paused domain") {
		t.Fatalf("save of a stopped domain = %v (final %v), want a final refusal", err, final)
	}
	if _, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtStart, "vm-s"); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(e.data, "victim")
	must(t, os.WriteFile(victim, []byte("root's"), 0o600))
	mem := filepath.Join(e.dir("vm-s"), MemoryFile)
	must(t, os.Symlink(victim, mem))
	if _, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtSave, "vm-s"); err != nil {
		t.Fatalf("save: %v", err)
	}
	if got := e.virsh(t, "domstate", "vm-s"); got != "shut off" {
		t.Fatalf("after save: %q, want shut off", got)
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's" {
		t.Fatalf("the symlink's target was written (%d bytes)", len(b))
	}
	st, err := os.Lstat(mem)
	must(t, err)
	b, err := os.ReadFile(mem)
	must(t, err)
	if !st.Mode().IsRegular() || st.Mode().Perm() != 0o640 || st.Sys().(*syscall.Stat_t).Uid != node || !bytes.HasPrefix(b, []byte("LibvirtQemudSave")) {
		t.Fatalf("memory file: mode %v uid %d, starts %q; want a regular 0640 file of the node's with libvirt's save header",
			st.Mode(), st.Sys().(*syscall.Stat_t).Uid, b[:min(16, len(b))])
	}
	if _, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtStart, "vm-s"); err != nil {
		t.Fatalf("start after save: %v", err)
	}
	if got := e.virsh(t, "domstate", "--reason", "vm-s"); got != "running (restored)" {
		t.Errorf("after start: %q, want running (restored)", got)
	}
	if _, err := os.Lstat(filepath.Join(e.host.Staging, "vm-s.save")); !os.IsNotExist(err) {
		t.Errorf("root's saved state is still there after the resume: %v", err)
	}
	for _, op := range []string{wire.OpLibvirtDestroy, wire.OpLibvirtUndefine} {
		if _, err := (Ops{}).Act(ctx, e.host, op, "vm-s"); err != nil {
			t.Fatal(err)
		}
	}
}

// testRestoredDisk: an instance restored from a snapshot is defined and
// started over the snapshot's disk (data_dir/snapshots/<sha256>.d), and
// refused, final, when that disk names a backing file of its own.
func testRestoredDisk(t *testing.T, e *env) {
	ctx := context.Background()
	for _, tt := range []struct {
		id, want string
		args     []string
	}{
		{id: "vm-r", args: []string{"64M"}},
		{id: "vm-rb", want: "names a backing file", args: []string{"-u", "-b", "/etc/shadow", "-F", "raw", "64M"}},
	} {
		digest := strings.Repeat("a", 64)
		if tt.want != "" {
			digest = strings.Repeat("b", 64)
		}
		snap := filepath.Join(e.data, "snapshots", digest+".d")
		must(t, os.MkdirAll(snap, 0o750))
		must(t, os.Chown(snap, node, node))
		disk := filepath.Join(snap, "disk.qcow2")
		e.run(t, append(append([]string{"create", "-q", "-f", "qcow2"}, tt.args[:len(tt.args)-1]...), disk, tt.args[len(tt.args)-1])...)
		must(t, os.Chown(disk, node, node))
		must(t, os.MkdirAll(e.dir(tt.id), 0o750))
		e.run(t, "create", "-q", "-f", "qcow2", "-u", "-b", disk, "-F", "qcow2", filepath.Join(e.dir(tt.id), vmruntime.DiskFile), "64M")
		must(t, seed.WriteFile(filepath.Join(e.dir(tt.id), vmruntime.SeedFile), seed.Seed{InstanceID: tt.id}))
		for _, f := range []string{"", vmruntime.DiskFile, vmruntime.SeedFile} {
			must(t, os.Chown(filepath.Join(e.dir(tt.id), f), node, node))
		}
		section := []byte(fmt.Sprintf(`{"images":[],"instances":[{"id":%q,"allocation":"a","state":"RUNNING","vcpus":1,"memory_mib":64,"restore_from":{"url":"https://s.example/x.tar","sha256":%q}}]}`, tt.id, digest))
		final, err := (Ops{}).Define(ctx, e.host, tt.id, section)
		if tt.want != "" {
			if err == nil || !final || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: Define = %v (final %v), want a final %q", tt.id, err, final, tt.want)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Define of a restored instance: %v", err)
		}
		if _, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtStart, tt.id); err != nil {
			t.Fatalf("start of a restored instance: %v", err)
		}
		for _, op := range []string{wire.OpLibvirtDestroy, wire.OpLibvirtUndefine} {
			must(t, func() error { _, err := (Ops{}).Act(ctx, e.host, op, tt.id); return err }())
		}
	}
}

// testMemoryRestore: a running domain's saved memory resumes a new
// instance defined over a copy of its disk ("running (restored)"); into
// a domain of another memory size it is refused, final, by QEMU, the
// domain left off; a memory file that is no save image is refused
// before libvirt is asked.
func testMemoryRestore(t *testing.T, e *env) {
	ctx := context.Background()
	e.instance(t, "vm-m")
	if _, err := (Ops{}).Define(ctx, e.host, "vm-m", e.section("", "vm-m")); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{wire.OpLibvirtStart, wire.OpLibvirtSave} {
		if _, err := (Ops{}).Act(ctx, e.host, op, "vm-m"); err != nil {
			t.Fatalf("%s: %v", op, err)
		}
	}
	mem, err := os.ReadFile(filepath.Join(e.dir("vm-m"), MemoryFile))
	must(t, err)
	digest := strings.Repeat("c", 64)
	snap := filepath.Join(e.data, "snapshots", digest+".d")
	must(t, os.MkdirAll(snap, 0o750))
	e.run(t, "convert", "-f", "qcow2", "-O", "qcow2", filepath.Join(e.dir("vm-m"), vmruntime.DiskFile), filepath.Join(snap, "disk.qcow2"))
	must(t, os.Chown(filepath.Join(snap, "disk.qcow2"), node, node))
	for _, tt := range []struct {
		id, want string
		memMiB   int
		mem      []byte
	}{
		{id: "vm-n", memMiB: 64, mem: mem},
		{id: "vm-big", memMiB: 128, mem: mem, want: "restore vm-big"},
		{id: "vm-junk", memMiB: 64, mem: []byte("not a save image at all, not at all, not at all, not at all, not at all, not at all, not at all"), want: "not a libvirt save image"},
	} {
		must(t, os.MkdirAll(e.dir(tt.id), 0o750))
		e.run(t, "create", "-q", "-f", "qcow2", "-u", "-b", filepath.Join(snap, "disk.qcow2"), "-F", "qcow2", filepath.Join(e.dir(tt.id), vmruntime.DiskFile), "64M")
		must(t, seed.WriteFile(filepath.Join(e.dir(tt.id), vmruntime.SeedFile), seed.Seed{InstanceID: tt.id}))
		must(t, os.WriteFile(filepath.Join(e.dir(tt.id), MemoryFile), tt.mem, 0o640))
		for _, f := range []string{"", vmruntime.DiskFile, vmruntime.SeedFile, MemoryFile} {
			must(t, os.Chown(filepath.Join(e.dir(tt.id), f), node, node))
		}
		section := []byte(fmt.Sprintf(`{"images":[],"instances":[{"id":%q,"allocation":"a","state":"RUNNING","vcpus":1,"memory_mib":%d,"restore_from":{"url":"https://s.example/x.tar","sha256":%q,"memory":true}}]}`, tt.id, tt.memMiB, digest))
		if _, err := (Ops{}).Define(ctx, e.host, tt.id, section); err != nil {
			t.Fatalf("%s: define: %v", tt.id, err)
		}
		final, err := (Ops{}).Restore(ctx, e.host, tt.id, section)
		state := e.virsh(t, "domstate", "--reason", tt.id)
		if tt.want == "" {
			if err != nil || state != "running (restored)" {
				t.Errorf("%s: Restore = %v, state %q; want running (restored)", tt.id, err, state)
			}
		} else if err == nil || !final || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(state, "shut off") {
			t.Errorf("%s: Restore = %v (final %v), state %q; want a final %q, the domain off", tt.id, err, final, state, tt.want)
		}
		for _, op := range []string{wire.OpLibvirtDestroy, wire.OpLibvirtUndefine} {
			(Ops{}).Act(ctx, e.host, op, tt.id)
		}
	}
	for _, op := range []string{wire.OpLibvirtDestroy, wire.OpLibvirtUndefine} {
		(Ops{}).Act(ctx, e.host, op, "vm-m")
	}
}

// testAttachIdentity: libvirt.attach-disk hot-adds the instance's
// identity disk to its running domain as vdz (read-only), once; a
// missing identity file, one that is a symlink and one of another uid
// are refused, final, with nothing attached; a stopped domain gets none.
func testAttachIdentity(t *testing.T, e *env) {
	ctx := context.Background()
	e.instance(t, "vm-i")
	if _, err := (Ops{}).Define(ctx, e.host, "vm-i", e.section("", "vm-i")); err != nil {
		t.Fatal(err)
	}
	attach := func() (bool, error) { return (Ops{}).Act(ctx, e.host, wire.OpLibvirtAttachDisk, "vm-i") }
	if final, err := attach(); err == nil || !final || !strings.Contains(err.Error(), "goes to a running domain") {
		t.Errorf("attach to a stopped domain = %v (final %v)", err, final)
	}
	if _, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtStart, "vm-i"); err != nil {
		t.Fatal(err)
	}
	ident := filepath.Join(e.dir("vm-i"), IdentityFile)
	other := filepath.Join(e.data, "other.iso")
	must(t, seed.WriteFile(other, seed.Seed{InstanceID: "other"}))
	must(t, os.Chown(other, node, node))
	for _, tt := range []struct {
		name, want string
		mk         func()
	}{
		{name: "missing", want: "no such file"},
		{name: "symlink", want: "symlink", mk: func() { must(t, os.Symlink(other, ident)) }},
		{name: "root's", want: "belongs to uid 0", mk: func() { must(t, seed.WriteFile(ident, seed.Seed{InstanceID: "x"})) }},
	} {
		os.Remove(ident)
		if tt.mk != nil {
			tt.mk()
		}
		if final, err := attach(); err == nil || !final || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: attach = %v (final %v), want a final %q", tt.name, err, final, tt.want)
		}
	}
	if got := e.virsh(t, "domblklist", "vm-i"); strings.Contains(got, "vdz") {
		t.Fatalf("a refused identity disk was attached:\n%s", got)
	}
	os.Remove(ident)
	must(t, seed.WriteFile(ident, seed.Seed{InstanceID: "vm-i"}))
	must(t, os.Chown(ident, node, node))
	for i := 0; i < 2; i++ {
		if _, err := attach(); err != nil {
			t.Fatalf("attach #%d: %v", i+1, err)
		}
	}
	if got := e.virsh(t, "domblklist", "vm-i"); !strings.Contains(got, "vdz") || !strings.Contains(got, ident) || strings.Count(got, "vdz") != 1 {
		t.Errorf("domblklist after the attach:\n%s", got)
	}
	if x := e.virsh(t, "dumpxml", "vm-i"); !strings.Contains(x, "<target dev='vdz' bus='virtio'/>\n      <readonly/>") {
		t.Errorf("vdz is not read-only:\n%s", x)
	} else if !strings.Contains(x, "<serial>"+domainxml.IdentitySerial+"</serial>") {
		t.Errorf("vdz has not the serial the guest's hook knows it by:\n%s", x)
	}
	for _, op := range []string{wire.OpLibvirtDestroy, wire.OpLibvirtUndefine} {
		(Ops{}).Act(ctx, e.host, op, "vm-i")
	}
}
