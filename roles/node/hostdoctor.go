package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/better-compute/bcd/components/host/unit"
	"github.com/better-compute/bcd/components/machine/doctor"
)

// withHostUnits makes doctor's cgroups, hugepages and vfio checks say what
// the host units asked of this host (read back from the files they own)
// beside what the host has: a 2 MiB pool other than the hugepages unit's
// warns, and so does a kernel argument of a unit the running kernel lacks
// (a reboot takes it).
func withHostUnits(checks []doctor.Check, sys unit.System) []doctor.Check {
	for i, c := range checks {
		if c.Run == nil {
			continue
		}
		run := c.Run
		switch c.Name {
		case "hugepages":
			checks[i].Run = func(ctx context.Context) doctor.Result {
				r := run(ctx)
				w := unit.ReadWanted(sys)
				if w.Pages2M != nil {
					have, _ := sys.ReadFile(unit.Pool2M)
					n := strings.TrimSpace(string(have))
					if n != fmt.Sprint(*w.Pages2M) {
						r.Status = worst(r.Status, doctor.Warn)
						r.Detail += fmt.Sprintf("; the hugepages unit asks for %d 2 MiB pages, the pool has %s", *w.Pages2M, n)
					} else {
						r.Detail += "; 2 MiB pool as the hugepages unit asks"
					}
				}
				return pending(r, w, "hugepages")
			}
		case "vfio":
			checks[i].Run = func(ctx context.Context) doctor.Result { return pending(run(ctx), unit.ReadWanted(sys), "iommu") }
		case "cgroups":
			checks[i].Run = func(ctx context.Context) doctor.Result { return pending(run(ctx), unit.ReadWanted(sys), "cpu") }
		}
	}
	return checks
}

// pending adds a unit's kernel arguments the running kernel lacks.
func pending(r doctor.Result, w unit.Wanted, name string) doctor.Result {
	if p := w.Pending[name]; len(p) > 0 {
		r.Status = worst(r.Status, doctor.Warn)
		r.Detail += fmt.Sprintf("; the %s unit put %s on the kernel command line, which the running kernel lacks (reboot: RebootRequired)", name, strings.Join(p, " "))
	} else if len(w.Args[name]) > 0 {
		r.Detail += fmt.Sprintf("; the running kernel has the %s unit's %s", name, strings.Join(w.Args[name], " "))
	}
	return r
}

func worst(a, b doctor.Status) doctor.Status {
	if a == doctor.Fail || b == doctor.Fail {
		return doctor.Fail
	}
	if a == doctor.Warn || b == doctor.Warn {
		return doctor.Warn
	}
	return a
}
