package main

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/host/unit"
	"github.com/better-compute/bcd/components/machine/doctor"
)

// Doctor's hugepages and vfio checks say what the units asked: a pool
// other than the hugepages unit's and a command-line argument the running
// kernel lacks warn.
func TestDoctorReflectsHostUnits(t *testing.T) {
	f := unit.NewFake()
	f.SetFile("/proc/cmdline", "root=/dev/vda\n")
	f.SetFile(unit.Pool2M, "4\n")
	f.SetFile(unit.HugepagesFile, "vm.nr_hugepages = 8\n")
	f.SetFile(unit.GrubDropIn("iommu"), `GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"`+"\n")
	ok := func(name string) doctor.Check {
		return doctor.Check{Name: name, Run: func(context.Context) doctor.Result {
			return doctor.Result{Name: name, Status: doctor.OK, Detail: "host"}
		}}
	}
	checks := withHostUnits([]doctor.Check{ok("hugepages"), ok("vfio"), ok("cgroups")}, f)
	for _, tc := range []struct {
		check  int
		status doctor.Status
		has    string
	}{
		{0, doctor.Warn, "the hugepages unit asks for 8 2 MiB pages, the pool has 4"},
		{1, doctor.Warn, "the iommu unit put iommu=pt on the kernel command line, which the running kernel lacks"},
		{2, doctor.OK, "host"},
	} {
		r := checks[tc.check].Run(context.Background())
		if r.Status != tc.status || !strings.Contains(r.Detail, tc.has) {
			t.Errorf("%s: %s %q, want %s with %q", r.Name, r.Status, r.Detail, tc.status, tc.has)
		}
	}
	f.SetFile(unit.Pool2M, "8\n")
	f.SetFile("/proc/cmdline", "root=/dev/vda iommu=pt\n")
	checks = withHostUnits([]doctor.Check{ok("hugepages"), ok("vfio")}, f)
	for _, c := range checks {
		if r := c.Run(context.Background()); r.Status != doctor.OK {
			t.Errorf("%s after the reboot: %s %q", r.Name, r.Status, r.Detail)
		}
	}
}
