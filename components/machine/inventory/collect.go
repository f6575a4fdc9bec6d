package inventory

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// Options says how Collect completes what procfs and sysfs tell.
type Options struct {
	// SMI runs nvidia-smi to complete the GPUs (nvsmi.ExecRunner("") on a
	// host build); nil leaves the GPUs as /proc/driver/nvidia shows them.
	SMI nvsmi.Runner
	// CompleteGPUs, when set, completes nvidia-smi's records before they
	// are merged (the host's PCIe slot widths, see package pcielink).
	CompleteGPUs func([]nvsmi.GPU)
}

// Collect reads this machine's inventory and seals it. Unreadable pieces
// are left empty and noted; the only error is ctx's.
func Collect(ctx context.Context, opts Options) (*Inventory, error) {
	inv := collect(ctx, "/", opts)
	if inv.OS.Arch == "" {
		inv.OS.Arch = unameArch(runtime.GOARCH)
	}
	inv.Seal()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("collect inventory: %w", err)
	}
	return inv, nil
}

// unameArch maps GOARCH to the machine name uname reports.
func unameArch(goarch string) string {
	switch goarch {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	}
	return goarch
}

// collect reads the inventory under root (root+"/sys/…", root+"/proc/…",
// root+"/etc/os-release", root+"/dev/kvm"). It does not seal it.
func collect(ctx context.Context, root string, opts Options) *Inventory {
	r := &reader{root: root}
	inv := &Inventory{Schema: Schema}
	inv.System = r.system()
	inv.CPU = r.cpu()
	inv.Memory = r.memory()
	inv.Disks = r.disks()
	inv.NICs = r.nics()
	inv.GPUs = r.gpus()
	inv.OS = r.os()
	inv.Cgroups = r.cgroups()
	inv.KVM = KVM{Present: r.exists("/dev/kvm")}
	inv.IOMMU = IOMMU{Units: r.count("/sys/class/iommu"), Groups: r.count("/sys/kernel/iommu_groups")}
	if opts.SMI != nil && ctx.Err() == nil {
		gpus, err := nvsmi.Collect(ctx, opts.SMI)
		if err != nil {
			r.note("%v", err)
		}
		if opts.CompleteGPUs != nil {
			opts.CompleteGPUs(gpus)
		}
		inv.MergeSMI(gpus)
	}
	inv.Notes = r.notes
	return inv
}

// reader reads files under a root and notes what it could not read.
type reader struct {
	root  string
	notes []string
}

func (r *reader) path(p string) string { return filepath.Join(r.root, p) }

func (r *reader) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// read returns the trimmed contents of p (a path under root). A missing
// file is noted only when required.
func (r *reader) read(p string, required bool) (string, bool) {
	b, err := os.ReadFile(r.path(p))
	if err != nil {
		if required || !errors.Is(err, fs.ErrNotExist) {
			r.note("read %s: %v", p, cleanErr(err))
		}
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// opt reads an optional file.
func (r *reader) opt(p string) string {
	s, _ := r.read(p, false)
	return s
}

// cleanErr drops the root prefix a PathError repeats.
func cleanErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func (r *reader) exists(p string) bool {
	_, err := os.Stat(r.path(p))
	return err == nil
}

// list returns the names in directory p, sorted; a missing directory is
// empty and not noted.
func (r *reader) list(p string) []string {
	ents, err := os.ReadDir(r.path(p))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.note("read directory %s: %v", p, cleanErr(err))
		}
		return nil
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func (r *reader) count(p string) int { return len(r.list(p)) }

// link returns the base name of the symlink target at p, or "".
func (r *reader) link(p string) string {
	t, err := os.Readlink(r.path(p))
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

func (r *reader) int(p string) (int64, bool) {
	s := r.opt(p)
	if s == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// The EFI variable holding the Secure Boot state: four bytes of attributes,
// then one byte, 1 when enabled.
const secureBootVar = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

func (r *reader) system() System {
	dmi := func(name string) string { return r.opt("/sys/class/dmi/id/" + name) }
	s := System{
		Vendor:      dmi("sys_vendor"),
		Product:     dmi("product_name"),
		Serial:      dmi("product_serial"),
		ProductUUID: strings.ToLower(dmi("product_uuid")),
		BoardVendor: dmi("board_vendor"),
		BoardName:   dmi("board_name"),
		BIOSVendor:  dmi("bios_vendor"),
		BIOSVersion: dmi("bios_version"),
		BIOSDate:    dmi("bios_date"),
		UEFI:        r.exists("/sys/firmware/efi"),
	}
	if s.UEFI {
		b, err := os.ReadFile(r.path(secureBootVar))
		switch {
		case err == nil && len(b) >= 5:
			s.SecureBoot = "disabled"
			if b[4] == 1 {
				s.SecureBoot = "enabled"
			}
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			r.note("read %s: %v", secureBootVar, cleanErr(err))
		}
	}
	for _, tpm := range r.list("/sys/class/tpm") {
		if !strings.HasPrefix(tpm, "tpm") {
			continue
		}
		s.TPM = true
		s.TPMVersion = r.opt("/sys/class/tpm/" + tpm + "/tpm_version_major")
		break
	}
	return s
}

func (r *reader) memory() Memory {
	var m Memory
	if s, ok := r.read("/proc/meminfo", true); ok {
		m.TotalBytes = meminfoTotal(s)
	}
	m.HugePages2M, _ = r.int("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
	m.HugePages1G, _ = r.int("/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages")
	return m
}

// meminfoTotal reads "MemTotal: 263856988 kB" from /proc/meminfo or a NUMA
// node's meminfo ("Node 0 MemTotal: … kB") in bytes.
func meminfoTotal(s string) uint64 {
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		for i, w := range f {
			if w != "MemTotal:" || i+1 >= len(f) {
				continue
			}
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return 0
			}
			if i+2 < len(f) && f[i+2] == "kB" {
				n *= 1024
			}
			return n
		}
	}
	return 0
}

func (r *reader) os() OS {
	var o OS
	if s, ok := r.read("/etc/os-release", true); ok {
		kv := osRelease(s)
		o.ID, o.VersionID, o.PrettyName = kv["ID"], kv["VERSION_ID"], kv["PRETTY_NAME"]
	}
	o.Kernel, _ = r.read("/proc/sys/kernel/osrelease", true)
	o.Arch = r.opt("/proc/sys/kernel/arch")
	o.BootID, _ = r.read("/proc/sys/kernel/random/boot_id", true)
	return o
}

// osRelease parses os-release's KEY=value lines, with quotes removed.
func osRelease(s string) map[string]string {
	kv := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		kv[strings.TrimSpace(k)] = v
	}
	return kv
}

func (r *reader) cgroups() Cgroups {
	if s, ok := r.read("/sys/fs/cgroup/cgroup.controllers", false); ok {
		c := strings.Fields(s)
		sort.Strings(c)
		return Cgroups{Version: "v2", Controllers: c}
	}
	var c Cgroups
	for _, name := range r.list("/sys/fs/cgroup") {
		switch name {
		case "unified":
			c.Version = "hybrid"
		case "cpu", "cpuacct", "cpu,cpuacct", "memory", "pids", "devices", "blkio", "cpuset", "freezer",
			"hugetlb", "net_cls", "net_prio", "net_cls,net_prio", "perf_event", "rdma", "misc":
			if fi, err := os.Lstat(r.path("/sys/fs/cgroup/" + name)); err == nil && fi.IsDir() {
				c.Controllers = append(c.Controllers, name)
			}
		}
	}
	if len(c.Controllers) > 0 && c.Version == "" {
		c.Version = "v1"
	}
	return c
}
