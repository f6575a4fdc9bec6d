package wire

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Limits of slice.apply.
const (
	MaxCPUList   = 1024 // bytes of a cpus or mems value
	MaxCPU       = 8191 // the highest CPU or memory node number accepted
	MaxSliceID   = 64   // characters of an allocation id in a slice name
	slicePrefix  = "bcd-alloc-"
	sliceSuffix  = ".slice"
	sliceIDChars = "[A-Za-z0-9_-]"
)

// MinMemoryMax is the smallest memory limit a slice takes (16 MiB): less
// cannot run a process, and 1 is more likely a unit mistake.
const MinMemoryMax = 16 << 20

// SliceDropinName is the drop-in of an allocation's slice, in
// /run/systemd/system/<slice>.d/.
const SliceDropinName = "50-bcd.conf"

// SliceDropinDir is the directory of slice's drop-in.
func SliceDropinDir(slice string) string { return "/run/systemd/system/" + slice + ".d" }

// SliceDropin is the content of a slice's drop-in: only what is set. The
// helper writes exactly this, and the node reads it back to tell whether
// a slice already runs with a hold's limits.
func SliceDropin(cpus, mems string, memoryMax uint64) []byte {
	var b strings.Builder
	b.WriteString("# Written by bcd (slice.apply); slice.remove removes it.\n[Slice]\n")
	if cpus != "" {
		b.WriteString("AllowedCPUs=" + cpus + "\n")
	}
	if mems != "" {
		b.WriteString("AllowedMemoryNodes=" + mems + "\n")
	}
	if memoryMax != 0 {
		b.WriteString("MemoryMax=" + strconv.FormatUint(memoryMax, 10) + "\n")
	}
	return []byte(b.String())
}

// SliceName is the systemd slice of allocation id: bcd-alloc-<id>.slice.
func SliceName(id string) string { return slicePrefix + id + sliceSuffix }

// SliceID returns the allocation id of a slice name
// bcd-alloc-<id>.slice, where id is [A-Za-z0-9_-], 1 to 64 characters.
// Since systemd reads each '-' of a slice name as a step down its
// hierarchy, the id may not start or end with '-' nor hold "--" (systemd
// refuses such names).
func SliceID(name string) (string, error) {
	id, ok := strings.CutPrefix(name, slicePrefix)
	if ok {
		id, ok = strings.CutSuffix(id, sliceSuffix)
	}
	if !ok || len(id) == 0 || len(id) > MaxSliceID {
		return "", fmt.Errorf("slice %q is not bcd-alloc-<id>.slice with an id of 1 to %d characters %s", clip(name), MaxSliceID, sliceIDChars)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return "", fmt.Errorf("slice %q: the id may hold only %s", clip(name), sliceIDChars)
		}
	}
	if id[0] == '-' || id[len(id)-1] == '-' || strings.Contains(id, "--") {
		return "", fmt.Errorf("slice %q: the id may not start or end with '-' or hold \"--\" (systemd reads '-' as a step down the slice hierarchy)", clip(name))
	}
	return id, nil
}

// ErrCPUList is wrapped by every refusal of a cpulist.
var ErrCPUList = errors.New("not a cpulist")

// ParseCPUList parses a cpulist in the one form the kernel prints
// (/sys/devices/system/cpu/online, cpuset.cpus.effective) and
// FormatCPUList writes: comma-separated items, each a number N or a range
// N-M with N < M, in ascending order with a gap between items (so "1,2"
// must be "1-2"), numbers in decimal without a sign, spaces or leading
// zeros, at most MaxCPU, and at most MaxCPUList bytes in all. It returns
// the numbers in order. The kernel's stride form (0-7:2) and an empty list
// are refused. One set has exactly one accepted spelling.
func ParseCPUList(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("empty: %w", ErrCPUList)
	}
	if len(s) > MaxCPUList {
		return nil, fmt.Errorf("%d bytes is more than %d: %w", len(s), MaxCPUList, ErrCPUList)
	}
	var out []int
	next := 0 // the lowest number the next item may start at
	for _, item := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		a, err := cpuNumber(lo)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", clip(item), err)
		}
		b := a
		if isRange {
			if b, err = cpuNumber(hi); err != nil {
				return nil, fmt.Errorf("%q: %w", clip(item), err)
			}
			if b <= a {
				return nil, fmt.Errorf("%q: a range must go up: %w", clip(item), ErrCPUList)
			}
		}
		if a < next {
			return nil, fmt.Errorf("%q: items must go up, apart, without overlap (write 1,2 as 1-2): %w", clip(item), ErrCPUList)
		}
		for n := a; n <= b; n++ {
			out = append(out, n)
		}
		next = b + 2
	}
	return out, nil
}

// FormatCPUList writes ascending, distinct numbers as the cpulist
// ParseCPUList accepts: "0-3,8".
func FormatCPUList(ns []int) string {
	var b strings.Builder
	for i := 0; i < len(ns); {
		j := i
		for j+1 < len(ns) && ns[j+1] == ns[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ns[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ns[j]))
		}
		i = j + 1
	}
	return b.String()
}

// cpuNumber parses one number of a cpulist.
func cpuNumber(s string) (int, error) {
	if s == "" || len(s) > 4 || s[0] == '0' && len(s) > 1 {
		return 0, fmt.Errorf("not a number from 0 to %d without leading zeros: %w", MaxCPU, ErrCPUList)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("not a number from 0 to %d: %w", MaxCPU, ErrCPUList)
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > MaxCPU {
		return 0, fmt.Errorf("not a number from 0 to %d: %w", MaxCPU, ErrCPUList)
	}
	return n, nil
}

// SliceCgroup is the cgroup of a slice under systemd's layout, where each
// '-' of the name steps down: bcd-alloc-a1.slice is
// bcd.slice/bcd-alloc.slice/bcd-alloc-a1.slice.
func SliceCgroup(slice string) string {
	name := strings.TrimSuffix(slice, ".slice")
	parts := strings.Split(name, "-")
	var dirs []string
	for i := range parts {
		dirs = append(dirs, strings.Join(parts[:i+1], "-")+".slice")
	}
	return path.Join(dirs...)
}

// SlicePopulated reads the slice's cgroup.events: populated 1 when a
// process is in the slice or below it. A slice without a cgroup (never
// started, or stopped) is empty.
func SlicePopulated(cgroupRoot, slice string) (bool, error) {
	p := filepath.Join(cgroupRoot, SliceCgroup(slice), "cgroup.events")
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", p, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		switch strings.TrimSpace(line) {
		case "populated 0":
			return false, nil
		case "populated 1":
			return true, nil
		}
	}
	return false, fmt.Errorf("%s has no populated line", p)
}
