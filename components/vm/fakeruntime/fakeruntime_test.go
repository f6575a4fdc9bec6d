package fakeruntime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/better-compute/bcd/components/vm/vmruntime"
	"github.com/better-compute/bcd/components/vm/vmruntime/runtimetest"
)

// TestSuite runs the shared runtime suite on records in a temp directory,
// with a boot id the harness changes to reboot.
func TestSuite(t *testing.T) {
	runtimetest.Run(t, runtimetest.Harness{Setup: func(t *testing.T) runtimetest.Host {
		dir := t.TempDir()
		var boot atomic.Int64
		bootID := func() (string, error) { return "boot-" + string(rune('a'+boot.Load())), nil }
		return runtimetest.Host{
			New: func() vmruntime.Runtime {
				rt, err := New(dir, bootID)
				if err != nil {
					t.Fatal(err)
				}
				return rt
			},
			Foreign: func(id string) {
				b, _ := json.Marshal(Record{Machine: vmruntime.Machine{ID: id, VCPUs: 1, MemoryMiB: 64}, State: vmruntime.Stopped})
				if err := os.WriteFile(filepath.Join(dir, id+".json"), b, 0o600); err != nil {
					t.Fatal(err)
				}
			},
			Reboot: func() { boot.Add(1) },
		}
	}})
}

// TestRealBootID: with no boot id function the kernel's is read, so a
// domain set RUNNING in this boot is still RUNNING to a new runtime.
func TestRealBootID(t *testing.T) {
	dir := t.TempDir()
	rt, err := New(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	m := vmruntime.Machine{ID: "vm-a", VCPUs: 1, MemoryMiB: 64, Disks: []vmruntime.Disk{{Name: "d.qcow2", Format: "qcow2"}}}
	if _, err := rt.Ensure(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := rt.SetState(ctx, "vm-a", vmruntime.Running); err != nil {
		t.Fatal(err)
	}
	rt2, _ := New(dir, nil)
	l, err := rt2.List(ctx)
	if err != nil || len(l) != 1 || l[0].State != vmruntime.Running {
		t.Errorf("List = %+v, %v; want vm-a RUNNING", l, err)
	}
	if _, err := rt.Ensure(ctx, vmruntime.Machine{ID: "../x", VCPUs: 1, MemoryMiB: 64}); err == nil {
		t.Error("Ensure of a bad id passed")
	}
}
