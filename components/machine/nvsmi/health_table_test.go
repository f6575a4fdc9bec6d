package nvsmi

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// verdict is what one check must say of a capture: its status and a part
// of its reason.
type verdict struct {
	status Status
	reason string
}

func ok(reason string) verdict   { return verdict{StatusPass, reason} }
func warn(reason string) verdict { return verdict{StatusWarn, reason} }
func fail(reason string) verdict { return verdict{StatusFail, reason} }

// captureCase is one row of the table: a machine built from committed
// captures (each file read unchanged, then edit applied where the row
// names a change), the XIDs of its boot, and what every check must say of
// GPU gpu. slot and first stand for what sysfs and this boot's first
// reading add (pcielink); zero means unknown.
type captureCase struct {
	name  string // one line: the machine and why the verdicts are what they are
	xml   string // nvidia-smi -q -x
	list  string // nvidia-smi -L
	link  string // nvidia-smi nvlink -s
	topo  string // nvidia-smi topo -m
	edit  [][2]string
	slot  int
	first int
	xids  []XID
	gpu   int
	want  map[string]verdict
}

func readCapture(t *testing.T, name string, edit [][2]string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, e := range edit {
		if !strings.Contains(s, e[0]) {
			t.Fatalf("%s has no %q to change", name, e[0])
		}
		s = strings.Replace(s, e[0], e[1], 1)
	}
	return s
}

// machine builds the GPUs of a case the way Collect does.
func (c captureCase) machine(t *testing.T) []GPU {
	t.Helper()
	var gpus []GPU
	if c.xml != "" {
		var err error
		gpus, err = ParseXML(strings.NewReader(readCapture(t, c.xml, c.edit)))
		if err != nil {
			t.Fatal(err)
		}
	}
	if c.list != "" {
		l, err := ParseList(strings.NewReader(readCapture(t, c.list, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if gpus == nil {
			for _, x := range l {
				gpus = append(gpus, GPU{Info: Info{Index: x.Index, UUID: x.UUID, Name: x.Name}})
			}
		}
		applyList(gpus, l)
	}
	if c.link != "" {
		st, err := ParseNVLink(strings.NewReader(readCapture(t, c.link, c.edit)))
		if err != nil {
			t.Fatal(err)
		}
		if gpus == nil {
			// nvlink -s alone: one record per GPU it names, by index
			// (the V100 capture's UUID was elided by its reporter).
			for _, s := range st {
				gpus = append(gpus, GPU{Info: Info{Index: s.Index, UUID: "GPU-index-" + string(rune('0'+s.Index))}})
				st := s
				st.UUID = ""
				applyNVLink(gpus[len(gpus)-1:], []NVLinkStatus{st})
			}
		} else {
			applyNVLink(gpus, st)
		}
	}
	if c.topo != "" {
		top, err := ParseTopo(strings.NewReader(readCapture(t, c.topo, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if gpus == nil {
			for _, r := range top.Rows {
				if strings.HasPrefix(r.Device, "GPU") {
					n := len(gpus)
					gpus = append(gpus, GPU{Info: Info{Index: n, UUID: "GPU-topo-" + r.Device[3:]}})
				}
			}
		}
		ApplyTopology(gpus, top)
	}
	if c.gpu >= len(gpus) {
		t.Fatalf("the captures hold %d GPUs, the case judges GPU %d", len(gpus), c.gpu)
	}
	gpus[c.gpu].PCIe.SlotWidthMax = c.slot
	gpus[c.gpu].PCIe.FirstWidth = c.first
	return gpus
}

// Verdicts every capture shares where the GPU does not have the feature.
var (
	noECC        = ok("ECC is not enabled on this GPU")
	noRetirement = ok("this GPU reports no page retirement")
	noRemapper   = ok("this GPU reports no row remapper")
	noRecovery   = ok("the driver asks for no recovery action")
	noRepair     = ok("no repair pending")
	noNVLink     = ok("no NVLink on this GPU")
	noXID        = ok("no XID this boot")
	fullX16      = ok("PCIe link at its full width x16")
	x8SlotUnsure = warn("PCIe link runs at x8 of the GPU's x16; the slot's width is unknown")
	noRemapWait  = ok("no row remap waits for a reset")
	noRemapFail  = ok("no row remapping failure (0 correctable, 0 uncorrectable remaps)")
	eccClean     = ok("no uncorrectable ECC errors since the driver loaded")
	noneRetired  = ok("no page retirement pending (0 pages retired)")
)

// TestCaptureVerdicts states, for every committed capture, what each check
// says of it and why. A healthy cloud GPU at a slot-limited width passes
// once the slot is known and warns until then; a GPU with inactive NVLinks
// fails; a pending retirement, row remap or repair warns.
func TestCaptureVerdicts(t *testing.T) {
	tests := []captureCase{
		// Cloud GPUs wired at x8.
		{name: "A10G on a cloud instance (pass-through), x8 of x16, slot unknown: warns, never fails", xml: "a10g.515.105.01.xml",
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapWait,
				CheckRowRemapFailure: noRemapFail, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: x8SlotUnsure,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the same A10G with its slot known to be x8 (sysfs): passes", xml: "a10g.515.105.01.xml", slot: 8,
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapWait,
				CheckRowRemapFailure: noRemapFail, CheckRecoveryAction: noRecovery, CheckRepair: noRepair,
				CheckPCIeLink: ok("PCIe link at x8, the width of its slot (the GPU supports x16)"), CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the same A10G in a x16 slot: a degraded link fails", xml: "a10g.515.105.01.xml", slot: 16,
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapWait,
				CheckRowRemapFailure: noRemapFail, CheckRecoveryAction: noRecovery, CheckRepair: noRepair,
				CheckPCIeLink: fail("below the x16 both the GPU and its slot support"), CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the A10G with a row remap pending (edited: remapped_row_pending Yes): warns", xml: "a10g.515.105.01.xml", slot: 8,
			edit: [][2]string{{"<remapped_row_pending>No", "<remapped_row_pending>Yes"}},
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: noRetirement,
				CheckRowRemapPending: warn("a row remap waits for a GPU reset"), CheckRowRemapFailure: noRemapFail, CheckRecoveryAction: noRecovery,
				CheckRepair: noRepair, CheckPCIeLink: ok("the width of its slot"), CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the A10G after Xid 79 and Xid 13: the fallen-off-the-bus Xid fails it", xml: "a10g.515.105.01.xml", slot: 8,
			xids: []XID{{Code: 13, PCIBusID: "0000:00:1e"}, {Code: 79, PCIBusID: "0000:00:1e"}},
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapWait,
				CheckRowRemapFailure: noRemapFail, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: ok("the width of its slot"),
				CheckNVLink: noNVLink, CheckXIDRecent: fail("2 XIDs this boot: 13, 79 (79 the GPU has fallen off the bus")}},
		{name: "T4 on a cloud instance, x8 of x16, ECC on, page retirement supported: warns on the link only", xml: "tesla-t4.515.105.01.xml",
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: noneRetired, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: x8SlotUnsure,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the T4 with a retirement pending (edited: pending_retirement Yes): warns", xml: "tesla-t4.515.105.01.xml", slot: 8,
			edit: [][2]string{{"<pending_retirement>No", "<pending_retirement>Yes"}},
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: warn("a page retirement is pending"),
				CheckRowRemapPending: noRemapper, CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair,
				CheckPCIeLink: ok("the width of its slot"), CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the T4 at x8 after training at x16 earlier this boot: fails", xml: "tesla-t4.515.105.01.xml", first: 16,
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: noneRetired, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair,
				CheckPCIeLink: fail("narrower than the x16 it trained at earlier this boot"), CheckNVLink: noNVLink, CheckXIDRecent: noXID}},

		// Pascal: page retirement, both spellings of pending.
		{name: "P100 PCIe (Pascal), ECC on, no pages retired: passes", xml: "tesla-p100-pcie-16gb.510.47.03.xml",
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: noneRetired, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the P100 with a retirement pending in the older spelling only (edited: pending_blacklist Yes): warns", xml: "tesla-p100-pcie-16gb.510.47.03.xml",
			edit: [][2]string{{"<pending_blacklist>No", "<pending_blacklist>Yes"}, {"<pending_retirement>No</pending_retirement>", ""}},
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: warn("takes effect at the next GPU reset or reboot"),
				CheckRowRemapPending: noRemapper, CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair,
				CheckPCIeLink: fullX16, CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the P100 at the driver's retirement limit (edited: 40 single-bit and 24 double-bit pages): fails", xml: "tesla-p100-pcie-16gb.510.47.03.xml",
			edit: [][2]string{{"<retired_count>0</retired_count>", "<retired_count>40</retired_count>"}, {"<retired_count>0</retired_count>", "<retired_count>24</retired_count>"}},
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: fail("64 pages retired (40 for single-bit, 24 for double-bit errors)"),
				CheckRowRemapPending: noRemapper, CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair,
				CheckPCIeLink: fullX16, CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "Quadro P2000 (Pascal), x8 of x16, slot unknown: warns on the link", xml: "quadro-p2000.525.125.06.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: x8SlotUnsure,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},

		// Older and reduced schemas, vGPU.
		{name: "GTX 1660 Ti on driver 418 (only pending_retirement, as N/A): passes", xml: "gtx-1660-ti.418.43.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "GTX 1070 Ti, DTD v10 without a maximum width, at x16: passes", xml: "gtx-1070-ti.dtd-v10.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "GRID P4-1Q vGPU in a Windows guest: every link value N/A, nothing to judge, passes", xml: "grid-p4-1q-vgpu.513.46.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair,
				CheckPCIeLink: ok("nvidia-smi reports no PCIe link width"), CheckNVLink: noNVLink, CheckXIDRecent: noXID}},

		// Ampere, Ada, Blackwell; the recovery and repair fields of newer drivers.
		{name: "RTX 3060 on 570 (recovery action None): passes", xml: "rtx-3060.570.124.04.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "RTX 3080 on 595 (repair fields No and N/A): passes", xml: "rtx-3080.595.58.03.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the RTX 3080 with a channel repair pending and the driver asking for a reset (edited): fails on the recovery action, warns on the repair", xml: "rtx-3080.595.58.03.xml",
			edit: [][2]string{{"<gpu_recovery_action>None", "<gpu_recovery_action>Reset"}, {"<channel_repair_pending>No", "<channel_repair_pending>Yes"}},
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: fail("the driver's recovery action is Reset"),
				CheckRepair: warn("a channel repair waits for a GPU reset"), CheckPCIeLink: fullX16, CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "the RTX 3080 with unrepairable memory and the driver asking to drain (edited): fails", xml: "rtx-3080.595.58.03.xml",
			edit: [][2]string{{"<gpu_recovery_action>None", "<gpu_recovery_action>Drain and Reset"}, {"<unrepairable_memory>N/A", "<unrepairable_memory>Yes"}},
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: fail("recovery action is Drain and Reset"),
				CheckRepair: fail("memory the GPU cannot repair"), CheckPCIeLink: fullX16, CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "RTX 4090 on 535 (row remapper, ECC off): passes", xml: "rtx-4090.535.86.05.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapWait,
				CheckRowRemapFailure: noRemapFail, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "RTX 4000 SFF Ada on 595: passes", xml: "rtx-4000-sff-ada.595.84.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapWait,
				CheckRowRemapFailure: noRemapFail, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "RTX PRO 6000 Blackwell Max-Q on 590, idle at PCIe gen 1 of 4: the generation is not judged, passes", xml: "rtx-pro-6000-blackwell-maxq.590.44.01.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapWait,
				CheckRowRemapFailure: noRemapFail, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "two RTX 2070 on a desktop board, both x8 of x16 (the board splits its lanes), slot unknown: the second warns", xml: "dual-rtx-2070.590.44.01.xml", gpu: 1,
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: x8SlotUnsure,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},
		{name: "two RTX A5000, both x16: the first passes", xml: "dual-rtx-a5000.590.44.01.xml",
			want: map[string]verdict{CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapWait,
				CheckRowRemapFailure: noRemapFail, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: noNVLink, CheckXIDRecent: noXID}},

		// MIG.
		{name: "A100 SXM4 40GB in MIG mode in a VM (remapped rows N/A): NVLinks not judged, passes", xml: "a100-sxm4-40gb-mig.510.47.03.xml",
			want: map[string]verdict{CheckECCUncorrectable: ok("nvidia-smi reports no ECC counters"), CheckRetiredPages: noRetirement,
				CheckRowRemapPending: noRemapper, CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair,
				CheckPCIeLink: fullX16, CheckNVLink: ok("MIG mode"), CheckXIDRecent: noXID}},
		{name: "A100 SXM4 80GB in MIG mode: passes", xml: "a100-sxm4-80gb-mig.535.54.03.xml",
			want: map[string]verdict{CheckECCUncorrectable: eccClean, CheckRetiredPages: noRetirement, CheckRowRemapPending: noRemapper,
				CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery, CheckRepair: noRepair, CheckPCIeLink: fullX16,
				CheckNVLink: ok("MIG mode"), CheckXIDRecent: noXID}},
		{name: "H100 in MIG mode from -L and nvlink -s (which says MIG mode): NVLinks not judged", list: "L.h100-mig.590.48.01.txt", link: "nvlink-s.h100-mig.590.48.01.txt",
			want: onlyNVLink(ok("MIG mode"))},
		{name: "H200 in MIG mode from -L and nvlink -s: NVLinks not judged", list: "L.h200-mig.590.48.01.txt", link: "nvlink-s.h200-mig.590.48.01.txt",
			want: onlyNVLink(ok("MIG mode"))},

		// NVLink and topology.
		{name: "eight A100 SXM4 80GB, 12 links each, all up: the fifth passes against its peers", link: "nvlink-s.a100-sxm4-80gb-x8.txt", gpu: 4,
			want: onlyNVLink(ok("all 12 NVLinks active"))},
		{name: "the eight A100s with links 2 and 7 of GPU 4 down (edited): fails naming them", link: "nvlink-s.a100-sxm4-80gb-x8.txt", gpu: 4,
			edit: [][2]string{
				{"bcdb)\n         Link 0: 25 GB/s\n         Link 1: 25 GB/s\n         Link 2: 25 GB/s", "bcdb)\n         Link 0: 25 GB/s\n         Link 1: 25 GB/s\n         Link 2: <inactive>"},
				{"Link 7: 25 GB/s\n         Link 8: 25 GB/s\n         Link 9: 25 GB/s\n         Link 10: 25 GB/s\n         Link 11: 25 GB/s\nGPU 5", "Link 7: <inactive>\n         Link 8: 25 GB/s\n         Link 9: 25 GB/s\n         Link 10: 25 GB/s\n         Link 11: 25 GB/s\nGPU 5"},
			},

			want: onlyNVLink(fail("NVLinks 2, 7 inactive (10 of 12 active)"))},
		{name: "V100 SXM2 of a DGX-1 with links 3 and 5 inactive (Azure/azhpc-diagnostics#73): fails naming them", link: "nvlink-s.v100-sxm2-32gb.inactive.txt",
			want: onlyNVLink(fail("NVLinks 3, 5 inactive (4 of 6 active)"))},
		{name: "H100 80GB HBM3, 18 links up, and its topology (one GPU): passes", link: "nvlink-s.h100-80gb-hbm3.590.48.01.txt", topo: "topo-m.h100-80gb-hbm3.590.48.01.txt",
			want: onlyNVLink(ok("all 18 NVLinks active"))},
		{name: "H200, 18 links up: passes", link: "nvlink-s.h200.590.48.01.txt",
			want: onlyNVLink(ok("all 18 NVLinks active"))},
		{name: "GB200, 18 links up (Blackwell): passes", link: "nvlink-s.gb200.txt",
			want: onlyNVLink(ok("all 18 NVLinks active"))},
		{name: "L40S, which has no NVLink: passes", link: "nvlink-s.l40s.595.80.txt",
			want: onlyNVLink(noNVLink)},
		{name: "four H100 with four NICs, NV6 between GPUs, no nvlink -s: the links' state is unknown, warns", topo: "topo-m.4x-h100-4nic.txt", gpu: 2,
			want: onlyNVLink(warn("the topology shows NVLinks to other GPUs"))},
		{name: "two A100 with five NICs, NV12, no nvlink -s: warns", topo: "topo-m.2x-a100-5nic.535.54.03.txt",
			want: onlyNVLink(warn("nvidia-smi nvlink -s reported none"))},
	}

	covered := map[string]bool{}
	for _, tt := range tests {
		for _, f := range []string{tt.xml, tt.list, tt.link, tt.topo} {
			covered[f] = true
		}
		t.Run(tt.name, func(t *testing.T) {
			gpus := tt.machine(t)
			got := map[string]Finding{}
			for _, f := range CheckAll(gpus, tt.xids) {
				if f.GPU == gpuName(gpus[tt.gpu]) {
					got[f.Check] = f
				}
			}
			for _, check := range Checks {
				w, ok := tt.want[check]
				if !ok {
					t.Errorf("the case states nothing for %s (%s %q)", check, got[check].Status, got[check].Reason)
					continue
				}
				f := got[check]
				if f.Status != w.status || !strings.Contains(f.Reason, w.reason) {
					t.Errorf("%s = %s %q; want %s with %q", check, f.Status, f.Reason, w.status, w.reason)
				}
				if f.Status != StatusPass && f.Action == "" && check != CheckPCIeLink {
					t.Errorf("%s: %s without an action", check, f.Status)
				}
			}
		})
	}

	// Every committed capture has a row.
	files, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, f := range files {
		n := f.Name()
		if n == "README.md" || n == "SOURCES" || covered[n] {
			continue
		}
		missing = append(missing, n)
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("captures without a row in this table: %v", missing)
	}
}

// onlyNVLink is the verdicts of a machine built from text captures alone:
// nothing but NVLinks and topology is known, so every other check passes
// with its "not reported" reason.
func onlyNVLink(v verdict) map[string]verdict {
	return map[string]verdict{
		CheckECCUncorrectable: noECC, CheckRetiredPages: noRetirement,
		CheckRowRemapPending: noRemapper, CheckRowRemapFailure: noRemapper, CheckRecoveryAction: noRecovery,
		CheckRepair: noRepair, CheckPCIeLink: ok("nvidia-smi reports no PCIe link width"), CheckNVLink: v, CheckXIDRecent: noXID,
	}
}
