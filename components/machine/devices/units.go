package devices

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// Ref is one entry of a hold's gpus, parsed: a whole GPU (GPU, by index
// or GPU-UUID), a MIG instance (MIG, a MIG-UUID; or GPU with GI and CI),
// or a slot of a shared GPU (GPU with Slot).
type Ref struct {
	GPU    string
	MIG    string
	GI, CI int // -1 unless a MIG instance by GPU instance
	Slot   int // -1 unless a slot
}

// ParseRef reads an entry of a hold's gpus: "3", "GPU-<uuid>",
// "MIG-<uuid>", "<gpu>/gi<G>/ci<C>" or "<gpu>/slot<S>".
func ParseRef(s string) (Ref, error) {
	r := Ref{GI: -1, CI: -1, Slot: -1}
	parts := strings.Split(s, "/")
	bad := fmt.Errorf("GPU %q is not an index, a GPU- or MIG-UUID, <gpu>/gi<G>/ci<C> or <gpu>/slot<S>", clip(s))
	if !gpuName(parts[0]) {
		return r, bad
	}
	switch {
	case len(parts) == 1 && strings.HasPrefix(parts[0], "MIG-"):
		r.MIG = parts[0]
		return r, nil
	case strings.HasPrefix(parts[0], "MIG-"):
		return r, bad
	case len(parts) == 1:
		r.GPU = parts[0]
	case len(parts) == 2:
		n, ok := small(parts[1], "slot", 64)
		if !ok {
			return r, bad
		}
		r.GPU, r.Slot = parts[0], n
	case len(parts) == 3:
		gi, ok1 := small(parts[1], "gi", 15)
		ci, ok2 := small(parts[2], "ci", 8)
		if !ok1 || !ok2 {
			return r, bad
		}
		r.GPU, r.GI, r.CI = parts[0], gi, ci
	default:
		return r, bad
	}
	return r, nil
}

// gpuName is an index (0 to 999) or a GPU- or MIG-UUID.
func gpuName(s string) bool {
	if n, ok := small(s, "", 1000); ok {
		return n >= 0
	}
	rest, ok := strings.CutPrefix(s, "GPU-")
	if !ok {
		rest, ok = strings.CutPrefix(s, "MIG-")
	}
	if !ok || len(rest) < 8 || len(rest) > 64 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' || c == '-') {
			return false
		}
	}
	return true
}

// small is prefix and a decimal below limit, without a leading zero.
func small(s, prefix string, limit int) (int, bool) {
	v, ok := strings.CutPrefix(s, prefix)
	n, err := strconv.Atoi(v)
	return n, ok && err == nil && n >= 0 && n < limit && strconv.Itoa(n) == v
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

type unitKind int

const (
	kindWhole unitKind = iota
	kindMIG
	kindSlot
)

// unit is a resolved entry: what it takes of which GPU, and the devices
// its CDI spec gives.
type unit struct {
	kind    unitKind
	gpu     inventory.GPU
	mig     nvsmi.MIGDevice
	slot    int
	devices []cdispec.GPU
}

func (u unit) migKey() string {
	return fmt.Sprintf("%d/%d", u.mig.GPUInstanceID, u.mig.ComputeInstanceID)
}

// String names u in a reason: GPU-..., MIG 2/0 of GPU-..., slot 1 of GPU-...
func (u unit) String() string {
	switch u.kind {
	case kindMIG:
		return fmt.Sprintf("MIG instance gi%d/ci%d (%s) of GPU %s", u.mig.GPUInstanceID, u.mig.ComputeInstanceID, u.mig.UUID, u.gpu.UUID)
	case kindSlot:
		return fmt.Sprintf("slot %d of GPU %s", u.slot, u.gpu.UUID)
	}
	return "GPU " + u.gpu.UUID
}

// short is u in bcd status's "held by" line.
func (u unit) short() string {
	switch u.kind {
	case kindMIG:
		return fmt.Sprintf("MIG gi%d/ci%d", u.mig.GPUInstanceID, u.mig.ComputeInstanceID)
	case kindSlot:
		return fmt.Sprintf("slot %d", u.slot)
	}
	return ""
}

// overlaps reports whether u and v take part of the same thing (within
// one hold).
func (u unit) overlaps(v unit) bool {
	if u.gpu.UUID != v.gpu.UUID {
		return false
	}
	switch {
	case u.kind == kindWhole || v.kind == kindWhole:
		return true
	case u.kind != v.kind:
		return false
	case u.kind == kindMIG:
		return u.migKey() == v.migKey()
	}
	return u.slot == v.slot
}

// machine is the host as admission sees it.
type machine struct {
	inv     *inventory.Inventory
	caps    cdispec.MIGCaps
	sharing *Sharing
	byRef   map[string]inventory.GPU
	byMIG   map[string]inventory.GPU
	cpus    map[int]bool
}

func newMachine(inv *inventory.Inventory, caps cdispec.MIGCaps, sh *Sharing) *machine {
	m := &machine{inv: inv, caps: caps, sharing: sh, byRef: map[string]inventory.GPU{}, byMIG: map[string]inventory.GPU{}, cpus: map[int]bool{}}
	for i, g := range inv.GPUs {
		m.byRef[g.UUID] = g
		m.byRef[strconv.Itoa(i)] = g
		for _, d := range migDevices(g) {
			m.byMIG[d.UUID] = g
		}
	}
	for i := range max(inv.CPU.Threads, 0) {
		m.cpus[i] = true
	}
	return m
}

func migDevices(g inventory.GPU) []nvsmi.MIGDevice {
	if g.SMI == nil || g.SMI.MIG.Current != "Enabled" {
		return nil
	}
	return g.SMI.MIG.Devices
}

func hasMIG(inv *inventory.Inventory) bool {
	for _, g := range inv.GPUs {
		if len(migDevices(g)) > 0 {
			return true
		}
	}
	return false
}

// resolve finds what entry r takes on this host; a non-empty reason when
// it cannot.
func (m *machine) resolve(r string) (unit, string) {
	ref, _ := ParseRef(r) // Decode checked it
	var g inventory.GPU
	var ok bool
	if ref.MIG != "" {
		g, ok = m.byMIG[ref.MIG]
	} else {
		g, ok = m.byRef[ref.GPU]
	}
	if !ok {
		return unit{}, fmt.Sprintf("GPU %s is not on this host", r)
	}
	if g.Minor == nil {
		return unit{}, fmt.Sprintf("GPU %s has no device minor", r)
	}
	u := unit{gpu: g, slot: -1}
	node := fmt.Sprintf("/dev/nvidia%d", *g.Minor)
	migs := migDevices(g)
	switch {
	case ref.MIG != "" || ref.GI >= 0:
		u.kind = kindMIG
		i := -1
		for j, d := range migs {
			if d.UUID == ref.MIG && ref.MIG != "" || ref.MIG == "" && d.GPUInstanceID == ref.GI && d.ComputeInstanceID == ref.CI {
				i = j
			}
		}
		if len(migs) == 0 {
			return u, fmt.Sprintf("GPU %s is not in MIG mode, so %s names no MIG instance", g.UUID, r)
		}
		if i < 0 {
			return u, fmt.Sprintf("GPU %s has no MIG instance %s", g.UUID, r)
		}
		u.mig = migs[i]
		d, why := m.migDevice(g, u.mig, node)
		if why != "" {
			return u, why
		}
		u.devices = []cdispec.GPU{d}
	case ref.Slot >= 0:
		u.kind, u.slot = kindSlot, ref.Slot
		switch {
		case m.sharing == nil:
			return u, fmt.Sprintf("%s: this host does not share GPUs (the section has no sharing), so a GPU has no slots", r)
		case len(migs) > 0:
			return u, fmt.Sprintf("%s: GPU %s is in MIG mode: hold its MIG instances, not slots", r, g.UUID)
		case ref.Slot >= m.sharing.Slots:
			return u, fmt.Sprintf("resources-exhausted: %s: a GPU has %d slots (0 to %d)", r, m.sharing.Slots, m.sharing.Slots-1)
		}
		u.devices = []cdispec.GPU{{UUID: g.UUID, Node: node}}
	default:
		u.kind = kindWhole
		// A whole GPU in MIG mode is all its instances.
		for _, d := range migs {
			dev, why := m.migDevice(g, d, node)
			if why != "" {
				return u, why
			}
			u.devices = append(u.devices, dev)
		}
		if len(migs) == 0 {
			u.devices = []cdispec.GPU{{UUID: g.UUID, Node: node}}
		}
	}
	return u, ""
}

// migDevice is MIG instance d of g as a CDI device: the parent's node and
// the instance's capability nodes.
func (m *machine) migDevice(g inventory.GPU, d nvsmi.MIGDevice, node string) (cdispec.GPU, string) {
	if d.UUID == "" {
		return cdispec.GPU{}, fmt.Sprintf("MIG instance gi%d/ci%d of GPU %s has no UUID (nvidia-smi -L did not list it)", d.GPUInstanceID, d.ComputeInstanceID, g.UUID)
	}
	caps, err := m.caps.Nodes(*g.Minor, d.GPUInstanceID, d.ComputeInstanceID)
	if err != nil {
		return cdispec.GPU{}, err.Error()
	}
	return cdispec.GPU{UUID: d.UUID, Node: node, Caps: caps}, ""
}

// fits checks limits against the host; a non-empty reason when beyond it.
func (m *machine) fits(l *Limits) string {
	if l == nil {
		return ""
	}
	if l.CPUs != "" {
		cpus, _ := wire.ParseCPUList(l.CPUs) // Decode checked it
		for _, c := range cpus {
			if !m.cpus[c] {
				return fmt.Sprintf("resources-exhausted: CPU %d is beyond this host's %d", c, m.inv.CPU.Threads)
			}
		}
	}
	if l.MemoryBytes > m.inv.Memory.TotalBytes {
		return fmt.Sprintf("resources-exhausted: memory %d bytes is beyond this host's %d", l.MemoryBytes, m.inv.Memory.TotalBytes)
	}
	if l.HugePages2M > m.inv.Memory.HugePages2M {
		return fmt.Sprintf("resources-exhausted: %d huge pages of 2 MiB is beyond this host's %d", l.HugePages2M, m.inv.Memory.HugePages2M)
	}
	return ""
}

// maxSlotsOnOneGPU is the most slots units take of one GPU.
func maxSlotsOnOneGPU(units []unit) int {
	n := map[string]int{}
	best := 0
	for _, u := range units {
		if u.kind == kindSlot {
			n[u.gpu.UUID]++
			best = max(best, n[u.gpu.UUID])
		}
	}
	return best
}
