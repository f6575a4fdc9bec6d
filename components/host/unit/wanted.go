package unit

import (
	"slices"
	"strconv"
	"strings"
)

// Wanted is what the units' own files ask of the host, read back from the
// host (bcd doctor shows it beside what the host has, with no spec).
type Wanted struct {
	// Pages2M is the 2 MiB pool hugepages' file asks for (nil: none).
	Pages2M *uint64
	// Args are the kernel arguments of each unit's boot loader drop-in.
	Args map[string][]string
	// Pending are those the running kernel lacks (a reboot takes them).
	Pending map[string][]string
}

// ReadWanted reads the files the units own.
func ReadWanted(sys System) Wanted {
	w := Wanted{Args: map[string][]string{}, Pending: map[string][]string{}}
	if b, err := sys.ReadFile(HugepagesFile); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "vm.nr_hugepages = "); ok {
				if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
					w.Pages2M = &n
				}
			}
		}
	}
	running, _ := sys.ReadFile("/proc/cmdline")
	have := strings.Fields(string(running))
	for _, u := range []string{"hugepages", "cpu", "iommu"} {
		b, err := sys.ReadFile(GrubDropIn(u))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			v, ok := strings.CutPrefix(l, `GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX `)
			if !ok {
				continue
			}
			args := strings.Fields(strings.TrimSuffix(v, `"`))
			w.Args[u] = args
			for _, a := range args {
				if !slices.Contains(have, a) {
					w.Pending[u] = append(w.Pending[u], a)
				}
			}
		}
	}
	return w
}
