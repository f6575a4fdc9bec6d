// Package fakeruntime is the file-backed VM runtime of fakehw builds and
// bcd sim: each domain is a JSON record in its directory, so instances
// outlive the process as real ones outlive bcd, and a record names the
// boot it ran in, so every running or paused instance is STOPPED once the
// boot id changes (the host rebooted). A record without bcd's mark is a
// domain bcd did not create: listed, never touched. It runs no guest.
// docs/instances.md describes it.
package fakeruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// Name is the runtime's kind.
const Name = "fakehw"

// BootIDFile is where the kernel says which boot this is.
const BootIDFile = "/proc/sys/kernel/random/boot_id"

// Record is one domain's file, <dir>/<id>.json.
type Record struct {
	// BCD is bcd's mark, the instance id; empty: not bcd's domain.
	BCD     string            `json:"bcd,omitempty"`
	Machine vmruntime.Machine `json:"machine"`
	State   string            `json:"state"`
	// BootID is the boot the domain last ran in (RUNNING or PAUSED).
	BootID string `json:"boot_id,omitempty"`
}

// Runtime keeps domains as records in Dir.
type Runtime struct {
	dir    string
	bootID func() (string, error)
	mu     sync.Mutex
}

// New returns the runtime over dir (created 0700 if missing). bootID
// reads the current boot's id; nil: BootIDFile.
func New(dir string, bootID func() (string, error)) (*Runtime, error) {
	if bootID == nil {
		bootID = func() (string, error) {
			b, err := os.ReadFile(BootIDFile)
			return strings.TrimSpace(string(b)), err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("fake runtime: %w", err)
	}
	return &Runtime{dir: dir, bootID: bootID}, nil
}

// Name is "fakehw".
func (r *Runtime) Name() string { return Name }

func (r *Runtime) path(id string) string { return filepath.Join(r.dir, id+".json") }

// read returns the record of id, settled against the current boot: a
// domain that ran in another boot is STOPPED (and stored so).
func (r *Runtime) read(id string) (Record, error) {
	var rec Record
	if !domainxml.ValidID(id) {
		return rec, fmt.Errorf("fake runtime: %q is not an instance id", id)
	}
	b, err := os.ReadFile(r.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return rec, fmt.Errorf("fake runtime: domain %s: %w", id, vmruntime.ErrNotFound)
	}
	if err != nil {
		return rec, fmt.Errorf("fake runtime: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("fake runtime: domain %s: %w", id, err)
	}
	if rec.State != vmruntime.Stopped {
		boot, err := r.bootID()
		if err != nil {
			return rec, fmt.Errorf("fake runtime: boot id: %w", err)
		}
		if rec.BootID != boot {
			rec.State, rec.BootID = vmruntime.Stopped, ""
			if rec.BCD != "" {
				if err := r.write(id, rec); err != nil {
					return rec, err
				}
			}
		}
	}
	return rec, nil
}

func (r *Runtime) write(id string, rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(r.path(id), b, 0o600); err != nil {
		return fmt.Errorf("fake runtime: %w", err)
	}
	return nil
}

// owned reads id's record and refuses a domain bcd did not create.
func (r *Runtime) owned(id string) (Record, error) {
	rec, err := r.read(id)
	if err == nil && rec.BCD != id {
		err = fmt.Errorf("fake runtime: domain %s: %w", id, vmruntime.ErrForeign)
	}
	return rec, err
}

// List reports every record.
func (r *Runtime) List(context.Context) ([]vmruntime.Domain, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	names, err := filepath.Glob(filepath.Join(r.dir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("fake runtime: %w", err)
	}
	sort.Strings(names)
	var out []vmruntime.Domain
	for _, n := range names {
		id := strings.TrimSuffix(filepath.Base(n), ".json")
		if !domainxml.ValidID(id) {
			continue // a temporary file of atomicfile
		}
		rec, err := r.read(id)
		if err != nil {
			return nil, err
		}
		d := vmruntime.Domain{ID: id, State: rec.State, Owned: rec.BCD == id}
		if d.Owned {
			d.Machine = rec.Machine
		}
		out = append(out, d)
	}
	return out, nil
}

// Ensure writes m's record, STOPPED when new.
func (r *Runtime) Ensure(_ context.Context, m vmruntime.Machine) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := m.Request(domainxml.TCG).Check(domainxml.Host{InstancesDir: "/fake", ImagesDir: "/fake-images", Bridges: bridges(m), GPU: anyGPU, AllowTCG: true}); err != nil {
		return false, fmt.Errorf("fake runtime: %w", err)
	}
	rec, err := r.owned(m.ID)
	switch {
	case errors.Is(err, vmruntime.ErrNotFound):
		rec = Record{BCD: m.ID, State: vmruntime.Stopped}
	case err != nil:
		return false, err
	case rec.Machine.Equal(m):
		return false, nil
	}
	rec.Machine = m
	return true, r.write(m.ID, rec)
}

// bridges admits the machine's own bridges: the fake host has every one.
func bridges(m vmruntime.Machine) []string {
	var b []string
	for _, t := range m.Taps {
		b = append(b, t.Bridge)
	}
	return b
}

// anyGPU: the fake host has every GPU (the inventory's check is the
// converger's).
func anyGPU(string) (domainxml.PCI, bool) { return domainxml.PCI{}, true }

// SetState records the state, with the boot it runs in.
func (r *Runtime) SetState(_ context.Context, id, state string) error {
	if !vmruntime.ValidState(state) {
		return fmt.Errorf("fake runtime: state %q is not RUNNING, PAUSED or STOPPED", state)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, err := r.owned(id)
	if err != nil {
		return err
	}
	if rec.State == state {
		return nil
	}
	rec.State, rec.BootID = state, ""
	if state != vmruntime.Stopped {
		if rec.BootID, err = r.bootID(); err != nil {
			return fmt.Errorf("fake runtime: boot id: %w", err)
		}
	}
	return r.write(id, rec)
}

// Destroy removes id's record.
func (r *Runtime) Destroy(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.owned(id); errors.Is(err, vmruntime.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	if err := os.Remove(r.path(id)); err != nil {
		return fmt.Errorf("fake runtime: %w", err)
	}
	atomicfile.SyncDir(r.dir)
	return nil
}

var _ vmruntime.Runtime = (*Runtime)(nil)
