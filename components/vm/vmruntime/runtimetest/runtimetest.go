// Package runtimetest is the one suite every VM runtime passes
// (vmruntime.Runtime): definitions that are idempotent across restarts,
// every state change, destruction, domains bcd did not create listed and
// never touched, and, where the harness can reboot the host, instances
// stopped by a reboot.
//
// It is linked only by tests.
package runtimetest

import (
	"context"
	"errors"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// Harness is how the suite reaches one runtime.
type Harness struct {
	// Setup prepares a host of its own for one subtest.
	Setup func(t *testing.T) Host
	// Machine returns the machine the suite ensures for id; nil: a small
	// one with one qcow2 disk.
	Machine func(id string) vmruntime.Machine
}

// Host is one host the suite runs on.
type Host struct {
	// New returns a runtime over the host; each call is a restart of bcd
	// (a new runtime value over the same domains).
	New func() vmruntime.Runtime
	// Foreign defines a stopped domain named id that bcd did not create,
	// as an operator would by hand.
	Foreign func(id string)
	// Reboot, when not nil, reboots the host.
	Reboot func()
}

func (h Harness) machine(id string) vmruntime.Machine {
	if h.Machine != nil {
		return h.Machine(id)
	}
	return vmruntime.Machine{ID: id, VCPUs: 1, MemoryMiB: 128, Disks: []domainxml.Disk{{Name: "disk.qcow2", Format: "qcow2", Boot: 1}}}
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	ctx := context.Background()
	t.Run("EnsureDefinesStopped", func(t *testing.T) {
		rt := h.Setup(t).New()
		m := h.machine("vm-a")
		changed, err := rt.Ensure(ctx, m)
		if err != nil || !changed {
			t.Fatalf("Ensure = %v, %v; want a new definition", changed, err)
		}
		d := only(t, rt, "vm-a")
		if !d.Owned || d.State != vmruntime.Stopped || !d.Machine.Equal(m) {
			t.Errorf("listed %+v; want owned, STOPPED, %+v", d, m)
		}
	})
	t.Run("EnsureIdempotentAcrossRestarts", func(t *testing.T) {
		host := h.Setup(t)
		newRT := host.New
		m := h.machine("vm-a")
		if _, err := newRT().Ensure(ctx, m); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			rt := newRT()
			changed, err := rt.Ensure(ctx, m)
			if err != nil || changed {
				t.Errorf("Ensure again = %v, %v; want no change", changed, err)
			}
			if l := list(t, rt); len(l) != 1 {
				t.Errorf("%d domains after ensuring one %d times: %+v", len(l), i+2, l)
			}
		}
	})
	t.Run("EnsureRedefines", func(t *testing.T) {
		rt := h.Setup(t).New()
		m := h.machine("vm-a")
		if _, err := rt.Ensure(ctx, m); err != nil {
			t.Fatal(err)
		}
		m.VCPUs++
		m.MemoryMiB *= 2
		if changed, err := rt.Ensure(ctx, m); err != nil || !changed {
			t.Fatalf("Ensure with more vCPUs = %v, %v; want a change", changed, err)
		}
		if d := only(t, rt, "vm-a"); !d.Machine.Equal(m) {
			t.Errorf("listed %+v, want %+v", d.Machine, m)
		}
	})
	t.Run("States", func(t *testing.T) {
		host := h.Setup(t)
		newRT := host.New
		rt := newRT()
		if _, err := rt.Ensure(ctx, h.machine("vm-a")); err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{vmruntime.Running, vmruntime.Paused, vmruntime.Running, vmruntime.Running, vmruntime.Stopped, vmruntime.Paused, vmruntime.Stopped, vmruntime.Stopped} {
			if err := rt.SetState(ctx, "vm-a", s); err != nil {
				t.Fatalf("SetState %s: %v", s, err)
			}
			if d := only(t, newRT(), "vm-a"); d.State != s {
				t.Fatalf("after SetState %s a new runtime lists %s", s, d.State)
			}
		}
		if err := rt.SetState(ctx, "vm-a", "CRASHED"); err == nil {
			t.Error("SetState CRASHED passed")
		}
		if err := rt.SetState(ctx, "vm-none", vmruntime.Running); !errors.Is(err, vmruntime.ErrNotFound) {
			t.Errorf("SetState of no domain = %v, want ErrNotFound", err)
		}
	})
	t.Run("Destroy", func(t *testing.T) {
		rt := h.Setup(t).New()
		for _, id := range []string{"vm-a", "vm-b"} {
			if _, err := rt.Ensure(ctx, h.machine(id)); err != nil {
				t.Fatal(err)
			}
		}
		if err := rt.SetState(ctx, "vm-a", vmruntime.Running); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if err := rt.Destroy(ctx, "vm-a"); err != nil {
				t.Fatalf("Destroy #%d: %v", i+1, err)
			}
		}
		if l := list(t, rt); len(l) != 1 || l[0].ID != "vm-b" {
			t.Errorf("after Destroy: %+v, want vm-b alone", l)
		}
	})
	t.Run("ForeignListedNeverTouched", func(t *testing.T) {
		host := h.Setup(t)
		rt := host.New()
		host.Foreign("byhand")
		d := only(t, rt, "byhand")
		if d.Owned || d.State != vmruntime.Stopped {
			t.Errorf("a domain defined by hand is listed as %+v; want not owned, STOPPED", d)
		}
		if _, err := rt.Ensure(ctx, h.machine("byhand")); !errors.Is(err, vmruntime.ErrForeign) {
			t.Errorf("Ensure over it = %v, want ErrForeign", err)
		}
		if err := rt.SetState(ctx, "byhand", vmruntime.Running); !errors.Is(err, vmruntime.ErrForeign) {
			t.Errorf("SetState of it = %v, want ErrForeign", err)
		}
		if err := rt.Destroy(ctx, "byhand"); !errors.Is(err, vmruntime.ErrForeign) {
			t.Errorf("Destroy of it = %v, want ErrForeign", err)
		}
		if d2 := only(t, rt, "byhand"); d2.Owned || d2.State != vmruntime.Stopped {
			t.Errorf("after the refusals it is %+v", d2)
		}
	})
	t.Run("RebootStops", func(t *testing.T) {
		host := h.Setup(t)
		if host.Reboot == nil {
			testenv.NotApplicable(t, "this runtime's harness cannot reboot its host; a real host's reboot is the systemd tier's")
		}
		rt := host.New()
		m := h.machine("vm-a")
		if _, err := rt.Ensure(ctx, m); err != nil {
			t.Fatal(err)
		}
		if err := rt.SetState(ctx, "vm-a", vmruntime.Running); err != nil {
			t.Fatal(err)
		}
		host.Reboot()
		d := only(t, host.New(), "vm-a")
		if d.State != vmruntime.Stopped || !d.Machine.Equal(m) {
			t.Errorf("after a reboot: %+v; want STOPPED with its definition", d)
		}
	})
}

func list(t *testing.T, rt vmruntime.Runtime) []vmruntime.Domain {
	t.Helper()
	l, err := rt.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return l
}

// only returns the listed domain id, failing when there is not exactly one.
func only(t *testing.T, rt vmruntime.Runtime, id string) vmruntime.Domain {
	t.Helper()
	var found []vmruntime.Domain
	for _, d := range list(t, rt) {
		if d.ID == id {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d domains named %s", len(found), id)
	}
	return found[0]
}
