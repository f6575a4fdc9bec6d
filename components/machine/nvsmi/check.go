package nvsmi

import (
	"fmt"
	"sort"
	"strings"
)

// The checks of the diag.nvml command, per GPU.
const (
	CheckECCUncorrectable = "ecc.uncorrectable"
	CheckRowRemapPending  = "row-remap.pending"
	CheckRowRemapFailure  = "row-remap.failure"
	CheckPCIeLink         = "pcie.link"
	CheckXIDRecent        = "xid.recent"
)

// XID is one NVIDIA Xid event the kernel logged this boot.
type XID struct {
	Code int `json:"code"`
	// PCIBusID is the GPU's address as the kernel wrote it
	// ("0000:17:00", without the function); UUID is set when known.
	PCIBusID string `json:"pci_bus_id,omitempty"`
	UUID     string `json:"uuid,omitempty"`
	Message  string `json:"message,omitempty"`
}

// Finding is the outcome of one check on one GPU.
type Finding struct {
	GPU    string `json:"gpu"` // UUID, or PCI address when the UUID is unknown
	Check  string `json:"check"`
	Pass   bool   `json:"pass"`
	Reason string `json:"reason"`
}

// Check runs the diag.nvml health checks on g: uncorrectable ECC errors
// since the driver loaded, a row remap waiting for a reset, a failed row
// remap, a PCIe link narrower than its maximum width, and XIDs of this GPU
// in xids (this boot's). It returns one finding per check, in that order.
func Check(g GPU, xids []XID) []Finding {
	id := g.UUID
	if id == "" {
		id = g.PCIBusID
	}
	f := func(check string, pass bool, reason string) Finding {
		return Finding{GPU: id, Check: check, Pass: pass, Reason: reason}
	}
	var out []Finding

	v, a := g.ECC.Volatile, g.ECC.Aggregate
	switch {
	case !v.Supported && g.ECC.Current != "Enabled":
		out = append(out, f(CheckECCUncorrectable, true, "ECC is not enabled on this GPU"))
	case !v.Supported:
		out = append(out, f(CheckECCUncorrectable, true, "nvidia-smi reports no ECC counters"))
	case v.Uncorrectable > 0:
		out = append(out, f(CheckECCUncorrectable, false, fmt.Sprintf(
			"%d uncorrectable ECC errors since the driver loaded (DRAM %d, SRAM %d; %d over the GPU's life)",
			v.Uncorrectable, v.DRAMUncorrectable, v.SRAMUncorrectable, a.Uncorrectable)))
	default:
		out = append(out, f(CheckECCUncorrectable, true, "no uncorrectable ECC errors since the driver loaded"))
	}

	rr := g.RowRemap
	switch {
	case rr == nil:
		out = append(out, f(CheckRowRemapPending, true, "this GPU reports no row remapper"))
		out = append(out, f(CheckRowRemapFailure, true, "this GPU reports no row remapper"))
	default:
		if rr.Pending {
			out = append(out, f(CheckRowRemapPending, false, "a row remap waits for a GPU reset"))
		} else {
			out = append(out, f(CheckRowRemapPending, true, "no row remap waits for a reset"))
		}
		if rr.Failure {
			out = append(out, f(CheckRowRemapFailure, false, fmt.Sprintf(
				"row remapping failed: the GPU has no spare rows left (%d rows remapped for uncorrectable errors)",
				rr.Uncorrectable)))
		} else {
			out = append(out, f(CheckRowRemapFailure, true, fmt.Sprintf(
				"no row remapping failure (%d correctable, %d uncorrectable remaps)", rr.Correctable, rr.Uncorrectable)))
		}
	}

	p := g.PCIe
	switch {
	case p.WidthMax == 0 || p.WidthCurrent == 0:
		out = append(out, f(CheckPCIeLink, true, "nvidia-smi reports no PCIe link width"))
	case p.WidthCurrent < p.WidthMax:
		out = append(out, f(CheckPCIeLink, false, fmt.Sprintf(
			"PCIe link runs at x%d, narrower than its maximum x%d", p.WidthCurrent, p.WidthMax)))
	default:
		out = append(out, f(CheckPCIeLink, true, fmt.Sprintf("PCIe link at its full width x%d", p.WidthCurrent)))
	}

	var codes []int
	for _, x := range xids {
		if xidMatches(g, x) {
			codes = append(codes, x.Code)
		}
	}
	if len(codes) == 0 {
		out = append(out, f(CheckXIDRecent, true, "no XID this boot"))
	} else {
		sort.Ints(codes)
		var s []string
		for _, c := range codes {
			s = append(s, fmt.Sprint(c))
		}
		out = append(out, f(CheckXIDRecent, false, fmt.Sprintf("%d XIDs this boot: %s", len(codes), strings.Join(s, ", "))))
	}
	return out
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
