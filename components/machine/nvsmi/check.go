package nvsmi

import (
	"fmt"
	"sort"
	"strings"

	"github.com/better-compute/bcd/components/machine/xid"
)

// The checks of the diag.nvml command, per GPU, in the order Check
// returns them.
const (
	CheckECCUncorrectable = "ecc.uncorrectable"
	CheckRetiredPages     = "retired-pages"
	CheckRowRemapPending  = "row-remap.pending"
	CheckRowRemapFailure  = "row-remap.failure"
	CheckRecoveryAction   = "recovery.action"
	CheckRepair           = "repair"
	CheckPCIeLink         = "pcie.link"
	CheckNVLink           = "nvlink"
	CheckXIDRecent        = "xid.recent"
)

// Checks lists every per-GPU check in the order Check returns them.
var Checks = []string{
	CheckECCUncorrectable, CheckRetiredPages, CheckRowRemapPending, CheckRowRemapFailure,
	CheckRecoveryAction, CheckRepair, CheckPCIeLink, CheckNVLink, CheckXIDRecent,
}

// RetiredPagesLimit is how many pages the driver retires on a GPU before
// it can retire no more (dynamic page retirement, before Ampere): a GPU at
// the limit keeps the bad memory it finds next.
const RetiredPagesLimit = 64

// XID is one NVIDIA Xid event the kernel logged this boot.
type XID struct {
	Code int `json:"code"`
	// PCIBusID is the GPU's address as the kernel wrote it
	// ("0000:17:00", without the function); UUID is set when known.
	PCIBusID string `json:"pci_bus_id,omitempty"`
	UUID     string `json:"uuid,omitempty"`
	Message  string `json:"message,omitempty"`
}

// Status is a finding's verdict: a warning leaves the GPU in service (the
// operator should look, or act when convenient), a failure takes it out.
type Status string

// Statuses.
const (
	StatusPass Status = "pass"
	StatusWarn Status = "warn"
	StatusFail Status = "fail"
)

// Finding is the outcome of one check on one GPU. Status is the verdict;
// Pass is true when the check found nothing (status pass), as before
// statuses existed. Only a failure fails diag.nvml: a warning is reported
// and leaves the GPU in service. Action is what to do, as the driver or
// NVIDIA's documentation recommends it.
type Finding struct {
	GPU    string `json:"gpu"` // UUID, or PCI address when the UUID is unknown
	Check  string `json:"check"`
	Pass   bool   `json:"pass"`
	Status Status `json:"status"`
	Reason string `json:"reason"`
	Action string `json:"action,omitempty"`
}

// Check runs the diag.nvml health checks on one GPU and this boot's xids
// (those of other GPUs are ignored) and returns one finding per check, in
// the order of Checks. It knows nothing of the GPU's peers; CheckAll
// compares NVLinks across the GPUs of a machine as well.
func Check(g GPU, xids []XID) []Finding {
	return check(g, xids, peerLinks{})
}

// CheckAll runs Check on every GPU of one machine, comparing each GPU's
// active NVLinks with its peers'.
func CheckAll(gpus []GPU, xids []XID) []Finding {
	var out []Finding
	for i, g := range gpus {
		p := peerLinks{}
		for j, o := range gpus {
			if j == i {
				continue
			}
			if n := activeLinks(o); n > p.maxActive {
				p.maxActive, p.name = n, gpuName(o)
			}
		}
		out = append(out, check(g, xids, p)...)
	}
	return out
}

// Worst returns the worst status of fs (pass for none).
func Worst(fs []Finding) Status {
	w := StatusPass
	for _, f := range fs {
		switch {
		case f.Status == StatusFail:
			return StatusFail
		case f.Status == StatusWarn:
			w = StatusWarn
		}
	}
	return w
}

// peerLinks is what the other GPUs of the machine have: the most active
// NVLinks any of them has, and which.
type peerLinks struct {
	maxActive int
	name      string
}

func gpuName(g GPU) string {
	if g.UUID != "" {
		return g.UUID
	}
	return g.PCIBusID
}

func check(g GPU, xids []XID, peers peerLinks) []Finding {
	id := gpuName(g)
	var out []Finding
	add := func(check string, st Status, action, format string, a ...any) {
		out = append(out, Finding{GPU: id, Check: check, Pass: st == StatusPass, Status: st,
			Reason: fmt.Sprintf(format, a...), Action: action})
	}
	pass := func(check, format string, a ...any) { add(check, StatusPass, "", format, a...) }

	v, a := g.ECC.Volatile, g.ECC.Aggregate
	switch {
	case !v.Supported && g.ECC.Current != "Enabled":
		pass(CheckECCUncorrectable, "ECC is not enabled on this GPU")
	case !v.Supported:
		pass(CheckECCUncorrectable, "nvidia-smi reports no ECC counters")
	case v.Uncorrectable > 0:
		add(CheckECCUncorrectable, StatusFail, string(xid.ActionReset),
			"%d uncorrectable ECC errors since the driver loaded (DRAM %d, SRAM %d; %d over the GPU's life)",
			v.Uncorrectable, v.DRAMUncorrectable, v.SRAMUncorrectable, a.Uncorrectable)
	default:
		pass(CheckECCUncorrectable, "no uncorrectable ECC errors since the driver loaded")
	}

	rp := g.RetiredPages
	retired := rp.SingleBit + rp.DoubleBit
	switch {
	case !rp.Supported:
		pass(CheckRetiredPages, "this GPU reports no page retirement")
	case retired >= RetiredPagesLimit:
		add(CheckRetiredPages, StatusFail, string(xid.ActionSupport),
			"%d pages retired (%d for single-bit, %d for double-bit errors): the driver's limit of %d is reached, so it can retire no more bad memory",
			retired, rp.SingleBit, rp.DoubleBit, RetiredPagesLimit)
	case rp.Pending:
		add(CheckRetiredPages, StatusWarn, "reset the GPU or reboot when idle",
			"a page retirement is pending: it takes effect at the next GPU reset or reboot (%d pages retired so far)", retired)
	default:
		pass(CheckRetiredPages, "no page retirement pending (%d pages retired)", retired)
	}

	rr := g.RowRemap
	switch {
	case rr == nil:
		pass(CheckRowRemapPending, "this GPU reports no row remapper")
		pass(CheckRowRemapFailure, "this GPU reports no row remapper")
	default:
		if rr.Pending {
			add(CheckRowRemapPending, StatusWarn, "reset the GPU when idle",
				"a row remap waits for a GPU reset")
		} else {
			pass(CheckRowRemapPending, "no row remap waits for a reset")
		}
		if rr.Failure {
			add(CheckRowRemapFailure, StatusFail, string(xid.ActionSupport),
				"row remapping failed: the GPU has no spare rows left (%d rows remapped for uncorrectable errors)",
				rr.Uncorrectable)
		} else {
			pass(CheckRowRemapFailure,
				"no row remapping failure (%d correctable, %d uncorrectable remaps)", rr.Correctable, rr.Uncorrectable)
		}
	}

	checkRecovery(g, add, pass)
	checkPCIe(g, add, pass)
	checkNVLink(g, peers, add, pass)
	checkXIDs(g, xids, add, pass)
	return out
}

type addFunc func(check string, st Status, action, format string, a ...any)
type passFunc func(check, format string, a ...any)

// recoveryActions maps the driver's GPU recovery action to what an
// operator does.
var recoveryActions = map[string]string{
	"reset":           string(xid.ActionReset),
	"gpu reset":       string(xid.ActionReset),
	"reboot":          string(xid.ActionReboot),
	"node reboot":     string(xid.ActionReboot),
	"drain p2p":       "drain the GPU's peer-to-peer (NVLink) work, then reset the GPU",
	"drain and reset": "drain the GPU's work, then reset the GPU",
}

func checkRecovery(g GPU, add addFunc, pass passFunc) {
	switch ra := strings.ToLower(g.RecoveryAction); ra {
	case "", "none":
		pass(CheckRecoveryAction, "the driver asks for no recovery action")
	default:
		action, ok := recoveryActions[ra]
		if !ok {
			action = "see the driver's recovery action " + g.RecoveryAction
		}
		add(CheckRecoveryAction, StatusFail, action, "the driver's recovery action is %s", g.RecoveryAction)
	}

	r := g.Repair
	switch {
	case r.UnrepairableMemory:
		add(CheckRepair, StatusFail, string(xid.ActionSupport), "the driver reports memory the GPU cannot repair")
	case r.ChannelPending || r.TPCPending:
		var what []string
		if r.ChannelPending {
			what = append(what, "a channel repair")
		}
		if r.TPCPending {
			what = append(what, "a TPC repair")
		}
		add(CheckRepair, StatusWarn, "reset the GPU when idle", "%s waits for a GPU reset", strings.Join(what, " and "))
	default:
		pass(CheckRepair, "no repair pending")
	}
}

// checkPCIe tells a degraded link from a slot wired narrower than the GPU:
// a link below what both the GPU and its slot support, or narrower than
// it was earlier this boot, fails; narrower than the GPU supports with the
// slot unknown is a warning, since cloud instances and risers often wire a
// x16 GPU at x8. The generation is not judged: it drops while the GPU
// idles.
func checkPCIe(g GPU, add addFunc, pass passFunc) {
	p := g.PCIe
	cur := p.WidthCurrent
	switch {
	case cur == 0:
		pass(CheckPCIeLink, "nvidia-smi reports no PCIe link width (a virtual GPU, or a driver that does not say)")
	case p.FirstWidth > cur:
		add(CheckPCIeLink, StatusFail, "reseat the GPU or check its riser and slot, then reboot",
			"PCIe link runs at x%d, narrower than the x%d it trained at earlier this boot: the link degraded", cur, p.FirstWidth)
	case p.WidthMax == 0 && cur < 16 && p.SlotWidthMax == 0:
		add(CheckPCIeLink, StatusWarn, "",
			"PCIe link runs at x%d; neither the GPU's maximum nor the slot's is known, so a degradation cannot be told", cur)
	case p.WidthMax == 0 || cur >= p.WidthMax:
		pass(CheckPCIeLink, "PCIe link at its full width x%d", cur)
	case p.SlotWidthMax == 0:
		add(CheckPCIeLink, StatusWarn, "",
			"PCIe link runs at x%d of the GPU's x%d; the slot's width is unknown, so this may be how the slot is wired (common on cloud instances)",
			cur, p.WidthMax)
	case cur < min(p.SlotWidthMax, p.WidthMax):
		add(CheckPCIeLink, StatusFail, "reseat the GPU or check its riser and slot, then reboot",
			"PCIe link runs at x%d, below the x%d both the GPU and its slot support: the link degraded",
			cur, min(p.SlotWidthMax, p.WidthMax))
	default:
		pass(CheckPCIeLink, "PCIe link at x%d, the width of its slot (the GPU supports x%d)", cur, p.WidthMax)
	}
}

func activeLinks(g GPU) int {
	n := 0
	for _, l := range g.NVLinks {
		if l.Active {
			n++
		}
	}
	return n
}

// topoNVLinks reports whether g's topology reaches another GPU over NVLink
// (NV# in nvidia-smi topo -m).
func topoNVLinks(g GPU) bool {
	for _, t := range g.Topology {
		if strings.HasPrefix(t.Link, "NV") && len(t.Link) > 2 && t.Link[2] >= '0' && t.Link[2] <= '9' {
			return true
		}
	}
	return false
}

func checkNVLink(g GPU, peers peerLinks, add addFunc, pass passFunc) {
	const action = "reset the GPU; if links stay down, drain the node and run the field diagnostic"
	if g.MIG.Current == "Enabled" {
		pass(CheckNVLink, "MIG mode: nvidia-smi does not report NVLinks of a GPU in MIG mode")
		return
	}
	active := activeLinks(g)
	var inactive []string
	for _, l := range g.NVLinks {
		if !l.Active {
			inactive = append(inactive, fmt.Sprint(l.Link))
		}
	}
	total := len(g.NVLinks)
	switch {
	case total == 0 && peers.maxActive > 0:
		add(CheckNVLink, StatusFail, action,
			"nvidia-smi reports no NVLink on this GPU while %s has %d active", peers.name, peers.maxActive)
	case total == 0 && topoNVLinks(g):
		add(CheckNVLink, StatusWarn, "run nvidia-smi nvlink -s on the node",
			"the topology shows NVLinks to other GPUs, but nvidia-smi nvlink -s reported none, so their state is unknown")
	case total == 0:
		pass(CheckNVLink, "no NVLink on this GPU")
	case active == 0 && peers.maxActive == 0 && !topoNVLinks(g):
		pass(CheckNVLink, "none of its %d NVLinks is connected (no bridge or NVSwitch), and no peer uses NVLink", total)
	case len(inactive) > 0:
		add(CheckNVLink, StatusFail, action, "NVLinks %s inactive (%d of %d active)",
			strings.Join(inactive, ", "), active, total)
	case active < peers.maxActive:
		add(CheckNVLink, StatusFail, action, "%d active NVLinks, fewer than the %d of %s", active, peers.maxActive, peers.name)
	default:
		pass(CheckNVLink, "all %d NVLinks active", total)
	}
}

func checkXIDs(g GPU, xids []XID, add addFunc, pass passFunc) {
	var codes []int
	for _, x := range xids {
		if xidMatches(g, x) {
			codes = append(codes, x.Code)
		}
	}
	if len(codes) == 0 {
		pass(CheckXIDRecent, "no XID this boot")
		return
	}
	sort.Ints(codes)
	// One description per distinct code, the worst first.
	seen := map[int]bool{}
	var infos []xid.Info
	var s []string
	for _, c := range codes {
		s = append(s, fmt.Sprint(c))
		if !seen[c] {
			seen[c] = true
			info, _ := xid.Lookup(c)
			infos = append(infos, info)
		}
	}
	sort.SliceStable(infos, func(i, j int) bool { return infos[i].Severity > infos[j].Severity })
	st := StatusWarn
	if infos[0].Severity == xid.Fail {
		st = StatusFail
	}
	var desc []string
	for _, i := range infos {
		desc = append(desc, fmt.Sprintf("%d %s", i.Code, i.Meaning))
	}
	add(CheckXIDRecent, st, string(infos[0].Action), "%d XIDs this boot: %s (%s)",
		len(codes), strings.Join(s, ", "), strings.Join(desc, "; "))
}

func xidMatches(g GPU, x XID) bool {
	if x.UUID != "" && g.UUID != "" {
		return x.UUID == g.UUID
	}
	if x.PCIBusID == "" || g.PCIBusID == "" {
		return false
	}
	xb := NormalizeBusID(x.PCIBusID)
	gb := NormalizeBusID(g.PCIBusID)
	if xb == gb {
		return true
	}
	// The kernel writes "0000:17:00" without the function.
	gdev, _, _ := strings.Cut(gb, ".")
	xdev, xfn, hasFn := strings.Cut(xb, ".")
	return xdev == gdev && (!hasFn || xfn == "")
}
