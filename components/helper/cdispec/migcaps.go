package cdispec

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A MIG instance is reached in a container through the GPU's own device
// node and two capability devices of the nvidia-caps driver: the access
// device of its GPU instance and that of its compute instance
// (/dev/nvidia-caps/nvidia-cap<minor>). The driver lists every such minor
// in /proc/driver/nvidia-caps/mig-minors, one "<name> <minor>" line each:
// "config" and "monitor" (privileged: they create MIG instances and watch
// all of them, and no hold is ever given them), then for each GPU minor g,
// GPU instance i and compute instance c, "gpu<g>/gi<i>/access" and
// "gpu<g>/gi<i>/ci<c>/access".

// MIGMinorsFile is where the driver lists the capability minors.
const MIGMinorsFile = "/proc/driver/nvidia-caps/mig-minors"

// The driver's table covers 32 GPUs, 15 GPU instances of each and 8
// compute instances of each.
const (
	migGPUs = 32
	migGIs  = 15
	migCIs  = 8
	// maxMIGMinors bounds the table read: the driver's is about 100 KiB.
	maxMIGMinors = 1 << 20
)

// MIGCaps is the table of mig-minors: capability name to device minor.
type MIGCaps map[string]int

// ParseMIGCaps reads a mig-minors table strictly: each line a known name
// and a decimal minor, each name and minor at most once. A table it
// cannot read exactly is an error, so no hold is ever given a capability
// device read wrongly.
func ParseMIGCaps(b []byte) (MIGCaps, error) {
	if len(b) > maxMIGMinors {
		return nil, fmt.Errorf("mig-minors: %d bytes; at most %d", len(b), maxMIGMinors)
	}
	caps := MIGCaps{}
	minors := map[int]bool{}
	if len(b) == 0 {
		return caps, nil
	}
	for n, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		name, v, ok := strings.Cut(line, " ")
		m, err := strconv.Atoi(v)
		switch {
		case !ok || !capName(name):
			return nil, fmt.Errorf("mig-minors line %d: %q is not \"<capability> <minor>\"", n+1, short(line))
		case err != nil || m < 0 || m > 1<<20 || strconv.Itoa(m) != v:
			return nil, fmt.Errorf("mig-minors line %d: minor %q is not a decimal", n+1, short(v))
		case caps.has(name):
			return nil, fmt.Errorf("mig-minors line %d: %s is listed twice", n+1, name)
		case minors[m]:
			return nil, fmt.Errorf("mig-minors line %d: minor %d is listed twice", n+1, m)
		}
		caps[name] = m
		minors[m] = true
	}
	return caps, nil
}

func (c MIGCaps) has(name string) bool { _, ok := c[name]; return ok }

// short clips s for an error message.
func short(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// capName is config, monitor, gpu<g>/gi<i>/access or
// gpu<g>/gi<i>/ci<c>/access, numbers in the driver's ranges.
func capName(s string) bool {
	if s == "config" || s == "monitor" {
		return true
	}
	parts := strings.Split(s, "/")
	if (len(parts) != 3 && len(parts) != 4) || parts[len(parts)-1] != "access" {
		return false
	}
	ok := number(parts[0], "gpu", migGPUs) && number(parts[1], "gi", migGIs)
	if len(parts) == 4 {
		ok = ok && number(parts[2], "ci", migCIs)
	}
	return ok
}

// number is prefix followed by a decimal below limit, without a leading zero.
func number(s, prefix string, limit int) bool {
	v, ok := strings.CutPrefix(s, prefix)
	n, err := strconv.Atoi(v)
	return ok && err == nil && n >= 0 && n < limit && strconv.Itoa(n) == v
}

// CapNode is the device node of capability minor m.
func CapNode(m int) string { return "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(m) }

// capNode is /dev/nvidia-caps/nvidia-cap[0-9]{1,7}.
func capNode(p string) bool {
	n, ok := strings.CutPrefix(p, "/dev/nvidia-caps/nvidia-cap")
	return ok && len(n) >= 1 && len(n) <= 7 && all(n, func(c byte) bool { return '0' <= c && c <= '9' })
}

// Nodes returns the two capability device nodes of compute instance ci of
// GPU instance gi on the GPU of device minor gpu.
func (c MIGCaps) Nodes(gpu, gi, ci int) ([]string, error) {
	gName := fmt.Sprintf("gpu%d/gi%d/access", gpu, gi)
	cName := fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpu, gi, ci)
	g, ok1 := c[gName]
	m, ok2 := c[cName]
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%s lists no %s or %s (is the nvidia-caps driver loaded?)", MIGMinorsFile, gName, cName)
	}
	return []string{CapNode(g), CapNode(m)}, nil
}

// Allowed returns every GPU and compute instance access node of the GPUs
// of device minors gpus: what a hold on this host may be given. The
// config and monitor capabilities are never among them.
func (c MIGCaps) Allowed(gpus []int) []string {
	var out []string
	for name, m := range c {
		if name == "config" || name == "monitor" {
			continue
		}
		g, _, _ := strings.Cut(strings.TrimPrefix(name, "gpu"), "/")
		n, err := strconv.Atoi(g)
		if err == nil && slices.Contains(gpus, n) {
			out = append(out, CapNode(m))
		}
	}
	slices.Sort(out)
	return out
}

// RenderMIGCaps writes the table as the driver does, for a fake machine
// (fakehw): config 1, monitor 2, then each GPU's instances in order.
func RenderMIGCaps() []byte {
	var b strings.Builder
	b.WriteString("config 1\nmonitor 2\n")
	m := 3
	for g := range migGPUs {
		for i := range migGIs {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, i, m)
			m++
			for c := range migCIs {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, i, c, m)
				m++
			}
		}
	}
	return []byte(b.String())
}
