package doctor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tree makes a fake root: each key is a path under it, a file with the
// value as its contents, or a directory when the key ends in "/".
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, body := range files {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// hostCase is one fake tree and what a check should make of it.
type hostCase struct {
	name  string
	files map[string]string
	want  want
}

func runHost(t *testing.T, name string, mk func(root string) Check, tests []hostCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := tree(t, tt.files)
			tt.want.check(t, mk(root).Run(context.Background()), name)
		})
	}
}

func TestKVM(t *testing.T) {
	runHost(t, "kvm", kvm, []hostCase{
		{"present", map[string]string{"dev/kvm": ""}, want{status: OK, detail: "/dev/kvm present"}},
		{"absent", map[string]string{"dev/": ""}, want{status: Warn, contains: []string{"/dev/kvm missing: this host cannot run VPS instances"}}},
	})
}

func TestIOMMU(t *testing.T) {
	units := func(n int) map[string]string {
		m := map[string]string{"sys/class/iommu/": ""}
		for i := range n {
			m["sys/class/iommu/dmar"+string(rune('a'+i))+"/"] = ""
		}
		return m
	}
	runHost(t, "iommu", iommu, []hostCase{
		{"sixteen", units(16), want{status: OK, detail: "16 IOMMU units"}},
		{"one", units(1), want{status: OK, detail: "1 IOMMU unit"}},
		{"none", units(0), want{status: Warn, contains: []string{"no IOMMU units: GPUs cannot be passed through"}}},
		{"no class", map[string]string{"sys/": ""}, want{status: Warn, contains: []string{"no IOMMU units"}}},
		{"unreadable", map[string]string{"sys/class/iommu": "a file"}, want{status: Warn, contains: []string{"cannot count IOMMU units: ", "/sys/class/iommu"}}},
	})
}

func TestCgroups(t *testing.T) {
	const ctl = "sys/fs/cgroup/cgroup.controllers"
	runHost(t, "cgroups", cgroups, []hostCase{
		{"v2 with all", map[string]string{ctl: "cpuset cpu io memory hugetlb pids rdma misc\n"}, want{status: OK, detail: "cgroup v2: cpuset cpu io memory hugetlb pids rdma misc"}},
		{"v2 without hugetlb", map[string]string{ctl: "cpuset cpu io memory pids\n"}, want{status: Warn, contains: []string{"without the hugetlb controller", "huge page limits of holds are not enforced"}}},
		{"v2 without memory and cpuset", map[string]string{ctl: "cpu io pids\n"}, want{status: Fail, contains: []string{"without the cpuset, memory controller(s) (has cpu io pids)"}}},
		{"v2 delegating nothing", map[string]string{ctl: "\n"}, want{status: Fail, contains: []string{"(has none)"}}},
		{"v1", map[string]string{"sys/fs/cgroup/memory/": "", "sys/fs/cgroup/cpu/": ""}, want{status: Fail, contains: []string{"no cgroup v2", "cgroup v1 or hybrid", "systemd.unified_cgroup_hierarchy=1"}}},
	})
}

func TestHugePages(t *testing.T) {
	const mm = "sys/kernel/mm/hugepages/"
	pools := func(kv ...string) map[string]string {
		m := map[string]string{mm: ""}
		for i := 0; i+2 < len(kv); i += 3 {
			m[mm+"hugepages-"+kv[i]+"/nr_hugepages"] = kv[i+1] + "\n"
			m[mm+"hugepages-"+kv[i]+"/free_hugepages"] = kv[i+2] + "\n"
		}
		return m
	}
	meminfo := "MemTotal:       65536000 kB\nHugePages_Total:     512\nHugePages_Free:      500\nHugePages_Rsvd:        0\nHugepagesize:       2048 kB\n"
	runHost(t, "hugepages", hugepages, []hostCase{
		{"2 MiB pool", pools("2048kB", "1024", "512", "1048576kB", "0", "0"), want{status: OK, detail: "2 MiB: 512 free of 1024"}},
		{"both pools", pools("1048576kB", "4", "2", "2048kB", "1024", "1024"), want{status: OK, detail: "2 MiB: 1024 free of 1024, 1 GiB: 2 free of 4"}},
		{"other size", pools("64kB", "8", "8"), want{status: OK, detail: "64 KiB: 8 free of 8"}},
		{"no pool", pools("2048kB", "0", "0", "1048576kB", "0", "0"), want{status: OK, detail: "no huge page pool: huge-page-backed flavors and limits are refused here"}},
		{"meminfo", map[string]string{"proc/meminfo": meminfo}, want{status: OK, detail: "2 MiB: 500 free of 512"}},
		{"no huge pages in the kernel", map[string]string{"proc/meminfo": "MemTotal: 1 kB\n"}, want{status: OK, contains: []string{"no huge page pool"}}},
		{"bad sysfs falls back to meminfo", map[string]string{mm + "hugepages-2048kB/nr_hugepages": "x\n", mm + "hugepages-2048kB/free_hugepages": "1\n", "proc/meminfo": meminfo}, want{status: OK, detail: "2 MiB: 500 free of 512"}},
		{"nothing to read", map[string]string{"proc/": ""}, want{status: Warn, contains: []string{"cannot read the huge page pools", "/proc/meminfo"}}},
	})
}

func TestSizeName(t *testing.T) {
	for kib, want := range map[uint64]string{2048: "2 MiB", 1048576: "1 GiB", 64: "64 KiB", 32768: "32 MiB", 1536: "1536 KiB"} {
		if got := sizeName(kib); got != want {
			t.Errorf("sizeName(%d) = %q, want %q", kib, got, want)
		}
	}
}

func TestVFIO(t *testing.T) {
	iommu := map[string]string{"sys/class/iommu/dmar0/": ""}
	with := func(extra ...string) map[string]string {
		m := map[string]string{}
		for k, v := range iommu {
			m[k] = v
		}
		for _, p := range extra {
			m[p] = ""
		}
		return m
	}
	runHost(t, "vfio", vfio, []hostCase{
		{"ready", with("sys/module/vfio_pci/", "dev/vfio/vfio"), want{status: OK, detail: "vfio-pci loaded, /dev/vfio/vfio present"}},
		{"not loaded", with("dev/vfio/vfio"), want{status: Warn, detail: "vfio-pci is not loaded: GPU passthrough cannot rebind devices (modprobe vfio-pci)"}},
		{"neither", with(), want{status: Warn, detail: "vfio-pci is not loaded, /dev/vfio/vfio is missing: GPU passthrough cannot rebind devices (modprobe vfio-pci)"}},
		{"no IOMMU", map[string]string{"sys/class/": ""}, want{status: OK, contains: []string{"not needed: no IOMMU units"}}},
	})
}

func TestClock(t *testing.T) {
	kernel := func(synced bool, est time.Duration, err error) kernelClock {
		return func() (bool, time.Duration, error) { return synced, est, err }
	}
	noSyscall := errors.New("adjtimex: operation not permitted")
	tests := []struct {
		name   string
		files  map[string]string
		kernel kernelClock
		want   want
	}{
		{"synchronized", nil, kernel(true, 1500*time.Microsecond, nil), want{status: OK, detail: "synchronized (estimated error 1.5ms)"}},
		{"unsynchronized", map[string]string{"run/systemd/timesync/synchronized": ""}, kernel(false, 0, nil), want{status: Warn, contains: []string{"not synchronized (the kernel reports STA_UNSYNC)", "start an NTP client"}}},
		{"kernel unknown, timesyncd says synchronized", map[string]string{"run/systemd/timesync/synchronized": ""}, kernel(false, 0, noSyscall), want{status: OK, detail: "synchronized (systemd-timesyncd)"}},
		{"unknown", map[string]string{"run/": ""}, kernel(false, 0, noSyscall), want{status: Warn, contains: []string{"cannot tell whether the clock is synchronized (adjtimex: operation not permitted)"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := tree(t, tt.files)
			tt.want.check(t, clockCheck(root, tt.kernel).Run(context.Background()), "clock")
		})
	}
}
