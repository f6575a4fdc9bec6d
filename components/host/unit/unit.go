// Package unit holds the host section's config units, one per file, each
// with Check (decode its settings strictly), Plan (read the host, say what
// differs) and Apply (change it, idempotently) over a System. The node
// plans them; root applies them, as bcd node itself or through bcd
// helper's host.unit, which plans the unit again from the signed section.
// The units run in the fixed order of Order. docs/host.md describes them.
package unit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
)

// Conditions a unit raises.
const (
	RebootRequired    = "RebootRequired"
	FabricManagerDown = "FabricManagerDown"
	MPSDown           = "MPSDown"
)

// Order is the units in the order they run: the kernel first (modules
// before the sysctls that need them, huge pages before the CPUs), then the
// driver and the tools on top of it, the Kubernetes join last.
var Order = []string{
	"kernel-modules", "sysctl", "hugepages", "cpu", "iommu",
	"nvidia-driver", "fabric-manager", "gpu-settings", "mig-layout",
	"gpu-sharing", "container-toolkit", "k8s-join",
}

// Unit is one config unit. body is the unit's settings from the host
// section, nil when the section names none (nothing desired: the unit
// removes the files it owns).
type Unit interface {
	Name() string
	// Check decodes body strictly, touching nothing.
	Check(body json.RawMessage) error
	// Plan compares the host with body.
	Plan(ctx context.Context, sys System, body json.RawMessage) (Plan, error)
	// Apply makes p's changes; it is idempotent.
	Apply(ctx context.Context, sys System, body json.RawMessage, p Plan) error
}

// Plan is what a unit would change, and the conditions the host shows for
// it now (a command-line change waiting for a reboot).
type Plan struct {
	Changes    []string
	Conditions []Condition
	// Detail is the unit's own plan, handed back to its Apply.
	Detail any
}

// Condition is a condition a unit raises.
type Condition struct {
	Type    string
	Message string
}

// ErrInvalid marks settings a unit refuses (bad names, values out of
// range); ErrUnsupported a unit this build does not apply.
var (
	ErrInvalid     = errors.New("invalid")
	ErrUnsupported = errors.New("unsupported")
	// ErrRefused marks a change a unit will not make on this host now (a
	// GPU with a live hold or process): not retried until the host
	// changes.
	ErrRefused = errors.New("refused")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// decode decodes body strictly into v (nil body: v as it is).
func decode(body json.RawMessage, v any) error {
	if body == nil || string(bytes.TrimSpace(body)) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid("data after the unit's JSON value")
	}
	return nil
}

// absent reports whether body names nothing.
func absent(body json.RawMessage) bool {
	b := bytes.TrimSpace(body)
	return len(b) == 0 || string(b) == "null"
}

// Registry is the units a role composes, in Order.
type Registry struct {
	units []Unit
}

// NewRegistry returns the units in Order; a unit whose name Order lacks,
// or a name given twice, is an error (a programming error of the role).
func NewRegistry(units ...Unit) (*Registry, error) {
	r := &Registry{}
	for _, name := range Order {
		for _, u := range units {
			if u.Name() == name {
				if r.Get(name) != nil {
					return nil, fmt.Errorf("host unit %s given twice", name)
				}
				r.units = append(r.units, u)
			}
		}
	}
	for _, u := range units {
		if !slices.Contains(Order, u.Name()) {
			return nil, fmt.Errorf("host unit %q is not one of %v", u.Name(), Order)
		}
	}
	return r, nil
}

// Units answers the units in order.
func (r *Registry) Units() []Unit { return r.units }

// Get answers the named unit, nil when the registry lacks it.
func (r *Registry) Get(name string) Unit {
	for _, u := range r.units {
		if u.Name() == name {
			return u
		}
	}
	return nil
}

// Section is the host section's body: each unit's settings by its name.
type Section map[string]json.RawMessage

// DecodeSection decodes the host section strictly: an object of units the
// registry has, each checked by its unit. A nil body is no unit.
func (r *Registry) DecodeSection(body json.RawMessage) (Section, error) {
	s := Section{}
	if absent(body) {
		return s, nil
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("%w: the host section: %v", ErrInvalid, err)
	}
	for name, b := range s {
		u := r.Get(name)
		if u == nil {
			return nil, invalid("unknown host unit %q (the units are %v)", name, Order)
		}
		if err := u.Check(b); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return s, nil
}

// ApplyOne plans the named unit from a host section and applies what it
// finds: what root runs for host.unit, from the section it verified. It
// answers the changes made.
func (r *Registry) ApplyOne(ctx context.Context, sys System, name string, section json.RawMessage) ([]string, error) {
	u := r.Get(name)
	if u == nil {
		return nil, invalid("unknown host unit %q", name)
	}
	s, err := r.DecodeSection(section)
	if err != nil {
		return nil, err
	}
	p, err := u.Plan(ctx, sys, s[name])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(p.Changes) == 0 {
		return nil, nil
	}
	if err := u.Apply(ctx, sys, s[name], p); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return p.Changes, nil
}

// header is the first line of every file a unit writes.
func header(unit string) string {
	return "# Written by bcd (host unit " + unit + "); bcd rewrites or removes it, edit the host section instead.\n"
}

// syncFile plans one file bcd owns: want "" means the file should not be
// there. It answers the change line, "" when the file is as wanted.
func syncFile(sys System, name, want string) (string, error) {
	have, err := sys.ReadFile(name)
	switch {
	case err != nil && !isNotExist(err):
		return "", fmt.Errorf("read %s: %w", name, err)
	case err != nil && want == "":
		return "", nil
	case err != nil:
		return "write " + name, nil
	case want == "":
		return "remove " + name, nil
	case string(have) != want:
		return "write " + name, nil
	}
	return "", nil
}

// putFile makes a file bcd owns as wanted ("" removes it).
func putFile(sys System, name, want string) error {
	if want == "" {
		return sys.RemoveFile(name)
	}
	return sys.WriteFile(name, []byte(want))
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
