package doctor

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The host checks read under a root directory: "/" on the real path, a
// fake tree in tests.

// KVM checks that /dev/kvm exists; without it the host runs no VPS
// instances, which is a warning.
func KVM() Check { return kvm("/") }

func kvm(root string) Check {
	return Check{Name: "kvm", Run: func(context.Context) Result {
		p := filepath.Join(root, "dev/kvm")
		switch _, err := os.Stat(p); {
		case err == nil:
			return Result{Name: "kvm", Status: OK, Detail: "/dev/kvm present"}
		case errors.Is(err, fs.ErrNotExist):
			return Result{Name: "kvm", Status: Warn, Detail: "/dev/kvm missing: this host cannot run VPS instances (enable virtualization in the firmware; modprobe kvm_intel or kvm_amd)"}
		default:
			return Result{Name: "kvm", Status: Warn, Detail: fmt.Sprintf("/dev/kvm: %v", stripRoot(err, root))}
		}
	}}
}

// IOMMU counts the IOMMU units in /sys/class/iommu; none is a warning,
// since GPUs cannot then be passed through to instances.
func IOMMU() Check { return iommu("/") }

func iommu(root string) Check {
	return Check{Name: "iommu", Run: func(context.Context) Result {
		n, err := iommuUnits(root)
		switch {
		case err != nil:
			return Result{Name: "iommu", Status: Warn, Detail: fmt.Sprintf("cannot count IOMMU units: %v", stripRoot(err, root))}
		case n == 0:
			return Result{Name: "iommu", Status: Warn, Detail: "no IOMMU units: GPUs cannot be passed through to instances (enable VT-d or AMD-Vi in the firmware; intel_iommu=on on Intel)"}
		case n == 1:
			return Result{Name: "iommu", Status: OK, Detail: "1 IOMMU unit"}
		default:
			return Result{Name: "iommu", Status: OK, Detail: fmt.Sprintf("%d IOMMU units", n)}
		}
	}}
}

// iommuUnits counts the entries of /sys/class/iommu; a missing directory
// is none.
func iommuUnits(root string) (int, error) {
	ents, err := os.ReadDir(filepath.Join(root, "sys/class/iommu"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}

// Cgroups checks for the unified cgroup v2 hierarchy at /sys/fs/cgroup with
// the cpuset, cpu and memory controllers (fails without, since holds with
// limits cannot be confined) and hugetlb (warns without, since huge page
// limits are then not enforced).
func Cgroups() Check { return cgroups("/") }

func cgroups(root string) Check {
	return Check{Name: "cgroups", Run: func(context.Context) Result {
		r := Result{Name: "cgroups"}
		b, err := os.ReadFile(filepath.Join(root, "sys/fs/cgroup/cgroup.controllers"))
		if errors.Is(err, fs.ErrNotExist) {
			r.Status, r.Detail = Fail, "no cgroup v2 (/sys/fs/cgroup/cgroup.controllers is missing; cgroup v1 or hybrid): holds with limits cannot be confined; boot with systemd.unified_cgroup_hierarchy=1"
			return r
		}
		if err != nil {
			r.Status, r.Detail = Fail, fmt.Sprintf("cgroup v2: %v", stripRoot(err, root))
			return r
		}
		have := strings.Fields(string(b))
		var missing []string
		for _, c := range []string{"cpuset", "cpu", "memory"} {
			if !slices.Contains(have, c) {
				missing = append(missing, c)
			}
		}
		list := strings.Join(have, " ")
		if list == "" {
			list = "none"
		}
		switch {
		case len(missing) > 0:
			r.Status, r.Detail = Fail, fmt.Sprintf("cgroup v2 without the %s controller(s) (has %s): holds with limits cannot be confined", strings.Join(missing, ", "), list)
		case !slices.Contains(have, "hugetlb"):
			r.Status, r.Detail = Warn, fmt.Sprintf("cgroup v2 without the hugetlb controller (has %s): huge page limits of holds are not enforced", list)
		default:
			r.Status, r.Detail = OK, "cgroup v2: "+list
		}
		return r
	}}
}

// HugePages reports the free and total pages of each huge page pool, from
// /sys/kernel/mm/hugepages (else /proc/meminfo), or that there is none, so
// huge-page-backed flavors and limits are refused here.
func HugePages() Check { return hugepages("/") }

// pool is one huge page size's pool.
type pool struct {
	sizeKiB     uint64
	total, free uint64
}

func hugepages(root string) Check {
	return Check{Name: "hugepages", Run: func(context.Context) Result {
		r := Result{Name: "hugepages"}
		pools, err := sysfsPools(root)
		if err != nil || len(pools) == 0 {
			var merr error
			pools, merr = meminfoPools(root)
			if merr != nil {
				r.Status, r.Detail = Warn, fmt.Sprintf("cannot read the huge page pools: %v", stripRoot(merr, root))
				return r
			}
		}
		var parts []string
		var some bool
		for _, p := range pools {
			if p.total == 0 {
				continue
			}
			some = true
			parts = append(parts, fmt.Sprintf("%s: %d free of %d", sizeName(p.sizeKiB), p.free, p.total))
		}
		r.Status = OK
		if !some {
			r.Detail = "no huge page pool: huge-page-backed flavors and limits are refused here"
			return r
		}
		r.Detail = strings.Join(parts, ", ")
		return r
	}}
}

// sysfsPools reads /sys/kernel/mm/hugepages/hugepages-<size>kB/, smallest
// size first.
func sysfsPools(root string) ([]pool, error) {
	dir := filepath.Join(root, "sys/kernel/mm/hugepages")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []pool
	for _, e := range ents {
		s, ok := strings.CutPrefix(e.Name(), "hugepages-")
		if !ok {
			continue
		}
		size, err := strconv.ParseUint(strings.TrimSuffix(s, "kB"), 10, 64)
		if err != nil {
			continue
		}
		total, err1 := readUint(filepath.Join(dir, e.Name(), "nr_hugepages"))
		free, err2 := readUint(filepath.Join(dir, e.Name(), "free_hugepages"))
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		out = append(out, pool{sizeKiB: size, total: total, free: free})
	}
	slices.SortFunc(out, func(a, b pool) int { return cmp.Compare(a.sizeKiB, b.sizeKiB) })
	return out, nil
}

// meminfoPools reads the default size's pool from /proc/meminfo.
func meminfoPools(root string) ([]pool, error) {
	f, err := os.Open(filepath.Join(root, "proc/meminfo"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var p pool
	var seen int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(val)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		switch key {
		case "HugePages_Total":
			p.total, seen = n, seen+1
		case "HugePages_Free":
			p.free, seen = n, seen+1
		case "Hugepagesize":
			p.sizeKiB, seen = n, seen+1
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /proc/meminfo: %w", err)
	}
	if seen < 3 {
		return nil, nil // a kernel without huge pages
	}
	return []pool{p}, nil
}

// sizeName writes a page size as 2 MiB, 1 GiB, 64 KiB.
func sizeName(kib uint64) string {
	switch {
	case kib >= 1<<20 && kib%(1<<20) == 0:
		return fmt.Sprintf("%d GiB", kib>>20)
	case kib >= 1<<10 && kib%(1<<10) == 0:
		return fmt.Sprintf("%d MiB", kib>>10)
	default:
		return fmt.Sprintf("%d KiB", kib)
	}
}

// VFIO checks, on a host with an IOMMU, that vfio-pci is loaded and
// /dev/vfio/vfio exists; without them GPU passthrough cannot rebind
// devices, which is a warning.
func VFIO() Check { return vfio("/") }

func vfio(root string) Check {
	return Check{Name: "vfio", Run: func(context.Context) Result {
		r := Result{Name: "vfio"}
		if n, err := iommuUnits(root); err == nil && n == 0 {
			r.Status, r.Detail = OK, "not needed: no IOMMU units, so no GPU passthrough"
			return r
		}
		var missing []string
		if !exists(filepath.Join(root, "sys/module/vfio_pci")) {
			missing = append(missing, "vfio-pci is not loaded")
		}
		if !exists(filepath.Join(root, "dev/vfio/vfio")) {
			missing = append(missing, "/dev/vfio/vfio is missing")
		}
		if len(missing) > 0 {
			r.Status = Warn
			r.Detail = strings.Join(missing, ", ") + ": GPU passthrough cannot rebind devices (modprobe vfio-pci)"
			return r
		}
		r.Status, r.Detail = OK, "vfio-pci loaded, /dev/vfio/vfio present"
		return r
	}}
}

// kernelClock reports what the kernel knows of its clock's synchronization.
type kernelClock func() (synced bool, estError time.Duration, err error)

// Clock checks that the host clock is synchronized: the kernel's status
// (adjtimex, STA_UNSYNC) where it can be read, else whether
// systemd-timesyncd marked it synchronized
// (/run/systemd/timesync/synchronized). An unsynchronized or unknown clock
// is a warning.
func Clock() Check { return clockCheck("/", adjtimex) }

func clockCheck(root string, kernel kernelClock) Check {
	return Check{Name: "clock", Run: func(context.Context) Result {
		r := Result{Name: "clock"}
		const fix = "start an NTP client (systemd-timesyncd, chronyd): expiry and command deadlines depend on the clock"
		synced, est, err := kernel()
		switch {
		case err == nil && synced:
			r.Status, r.Detail = OK, fmt.Sprintf("synchronized (estimated error %s)", est)
			return r
		case err == nil:
			r.Status, r.Detail = Warn, "not synchronized (the kernel reports STA_UNSYNC): "+fix
			return r
		}
		if exists(filepath.Join(root, "run/systemd/timesync/synchronized")) {
			r.Status, r.Detail = OK, "synchronized (systemd-timesyncd)"
			return r
		}
		r.Status, r.Detail = Warn, fmt.Sprintf("cannot tell whether the clock is synchronized (%v): %s", err, fix)
		return r
	}}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func readUint(p string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", p, err)
	}
	return n, nil
}

// stripRoot drops a fake root from an error's paths, so a test tree's
// errors read like the real ones.
func stripRoot(err error, root string) string {
	if root == "/" || root == "" {
		return err.Error()
	}
	return strings.ReplaceAll(err.Error(), strings.TrimSuffix(root, "/"), "")
}
