package unit

import (
	"context"
	"errors"
)

// Root is the units as bcd helper runs them for host.unit
// (helper.HostUnits): the unit planned again from the section root
// verified, on the host under the helper's root, and applied.
type Root struct {
	Units *Registry
}

// Has reports whether the registry has the unit.
func (r Root) Has(name string) bool { return r.Units.Get(name) != nil }

// Apply plans and applies one unit from section on the host under root.
func (r Root) Apply(ctx context.Context, root, name string, section []byte) ([]string, bool, error) {
	changed, err := r.Units.ApplyOne(ctx, Real{Root: root}, name, section)
	return changed, Final(err), err
}

// Final reports whether retrying cannot mend err: invalid or unsupported
// settings, a refused change.
func Final(err error) bool {
	return errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnsupported) || errors.Is(err, ErrRefused)
}
