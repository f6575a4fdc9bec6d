package inventory

import (
	"sort"
	"strconv"
	"strings"
)

// placementFlag reports whether a CPU flag matters for placing workloads:
// virtualization, vector and matrix extensions, memory encryption, huge
// pages. The rest of /proc/cpuinfo's flags are left out of the inventory.
func placementFlag(f string) bool {
	switch f {
	case "vmx", "svm", "ept", "npt", "hypervisor", "x2apic", "pdpe1gb",
		"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "avx512_vnni",
		"amx_tile", "amx_bf16", "amx_int8",
		"aes", "sha_ni", "rdrand", "rdseed",
		"sme", "sev", "sev_es", "sev_snp", "tdx_guest",
		// arm64 Features
		"asimd", "atomics", "sha2", "sha512", "sve", "sve2":
		return true
	}
	return false
}

func (r *reader) cpu() CPU {
	var c CPU
	info, _ := r.read("/proc/cpuinfo", true)
	var (
		flags     = map[string]bool{}
		procs     int
		pkgs      = map[string]bool{}
		cores     = map[string]bool{}
		pkg, core string
	)
	for _, line := range strings.Split(info+"\n", "\n") {
		k, v, ok := strings.Cut(line, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok {
			if strings.TrimSpace(line) == "" && pkg != "" {
				pkgs[pkg] = true
				cores[pkg+"/"+core] = true
				pkg, core = "", ""
			}
			continue
		}
		switch k {
		case "processor":
			procs++
		case "vendor_id":
			if c.Vendor == "" {
				c.Vendor = v
			}
		case "model name", "Model":
			if c.Model == "" {
				c.Model = v
			}
		case "flags", "Features":
			for _, f := range strings.Fields(v) {
				if placementFlag(f) {
					flags[f] = true
				}
			}
		case "physical id":
			pkg = v
		case "core id":
			core = v
		}
	}
	for f := range flags {
		c.Flags = append(c.Flags, f)
	}
	sort.Strings(c.Flags)

	// sysfs topology is the better source (and the only one on arm64).
	sysPkgs, sysCores, threads := map[string]bool{}, map[string]bool{}, 0
	for _, name := range r.list("/sys/devices/system/cpu") {
		if !isNumbered(name, "cpu") {
			continue
		}
		dir := "/sys/devices/system/cpu/" + name + "/topology/"
		p, ok := r.read(dir+"physical_package_id", false)
		if !ok {
			continue // offline
		}
		co := r.opt(dir + "core_id")
		threads++
		sysPkgs[p] = true
		sysCores[p+"/"+co] = true
	}
	if threads > 0 {
		c.Sockets, c.Cores, c.Threads = len(sysPkgs), len(sysCores), threads
	} else {
		c.Sockets, c.Cores, c.Threads = len(pkgs), len(cores), procs
	}

	for _, name := range r.list("/sys/devices/system/node") {
		if !isNumbered(name, "node") {
			continue
		}
		id, _ := strconv.Atoi(strings.TrimPrefix(name, "node"))
		n := NUMANode{ID: id, CPUs: r.opt("/sys/devices/system/node/" + name + "/cpulist")}
		if m, ok := r.read("/sys/devices/system/node/"+name+"/meminfo", false); ok {
			n.MemoryBytes = meminfoTotal(m)
		}
		c.NUMA = append(c.NUMA, n)
	}
	sort.Slice(c.NUMA, func(i, j int) bool { return c.NUMA[i].ID < c.NUMA[j].ID })
	return c
}

// isNumbered reports whether name is prefix followed by a number (cpu12).
func isNumbered(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || rest == "" {
		return false
	}
	_, err := strconv.Atoi(rest)
	return err == nil
}
