package nvsmi

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	gpus, err := ParseXML(strings.NewReader(faultyXML))
	if err != nil {
		t.Fatal(err)
	}
	faulty, healthy := gpus[0], gpus[1]
	p100 := parseFile(t, "tesla-p100-pcie-16gb.510.47.03.xml")[0]
	ada := parseFile(t, "rtx-4000-sff-ada.595.84.xml")[0]

	type want struct {
		status Status
		reason string // a part of the reason
	}
	const pass, warn, fail = StatusPass, StatusWarn, StatusFail
	tests := []struct {
		name string
		gpu  GPU
		xids []XID
		want map[string]want
	}{
		{
			name: "every fault",
			gpu:  faulty,
			xids: []XID{
				{Code: 79, PCIBusID: "0000:18:00"},
				{Code: 48, PCIBusID: "0000:18:00"},
				{Code: 13, PCIBusID: "0000:2a:00"},
			},
			want: map[string]want{
				CheckECCUncorrectable: {fail, "3 uncorrectable ECC errors since the driver loaded (DRAM 2, SRAM 1; 7 over"},
				CheckRowRemapPending:  {warn, "a row remap waits for a GPU reset"},
				CheckRowRemapFailure:  {fail, "row remapping failed"},
				CheckPCIeLink:         {warn, "x8 of the GPU's x16; the slot's width is unknown"},
				CheckXIDRecent:        {fail, "2 XIDs this boot: 48, 79 (48 double-bit"},
			},
		},
		{
			name: "healthy H100",
			gpu:  healthy,
			xids: []XID{{Code: 79, PCIBusID: "0000:18:00"}},
			want: map[string]want{
				CheckECCUncorrectable: {pass, "no uncorrectable ECC errors"},
				CheckRowRemapPending:  {pass, "no row remap waits"},
				CheckRowRemapFailure:  {pass, "no row remapping failure"},
				CheckPCIeLink:         {pass, "full width x16"},
				CheckXIDRecent:        {pass, "no XID this boot"},
			},
		},
		{
			name: "XID matched by UUID",
			gpu:  healthy,
			xids: []XID{{Code: 94, UUID: "GPU-5f1caaaa-0000-1111-2222-333344445555"}},
			want: map[string]want{CheckXIDRecent: {warn, "1 XIDs this boot: 94 (94 contained"}},
		},
		{
			name: "Pascal with single-bit errors and no row remapper (capture)",
			gpu:  p100,
			want: map[string]want{
				CheckECCUncorrectable: {pass, "no uncorrectable ECC errors"},
				CheckRowRemapPending:  {pass, "no row remapper"},
				CheckRowRemapFailure:  {pass, "no row remapper"},
				CheckPCIeLink:         {pass, "x16"},
			},
		},
		{
			name: "ECC disabled (capture)",
			gpu:  ada,
			want: map[string]want{CheckECCUncorrectable: {pass, "ECC is not enabled"}},
		},
		{
			name: "nothing known",
			gpu:  GPU{Info: Info{PCIBusID: "0000:01:00.0"}},
			want: map[string]want{CheckPCIeLink: {pass, "no PCIe link width"}},
		},
	}
	order := Checks
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Check(tt.gpu, tt.xids)
			if len(got) != len(order) {
				t.Fatalf("got %d findings, want %d", len(got), len(order))
			}
			for i, f := range got {
				if f.Check != order[i] {
					t.Errorf("finding %d is %s, want %s", i, f.Check, order[i])
				}
				wantGPU := tt.gpu.UUID
				if wantGPU == "" {
					wantGPU = tt.gpu.PCIBusID
				}
				if f.GPU != wantGPU || f.Reason == "" {
					t.Errorf("%s: GPU %q reason %q", f.Check, f.GPU, f.Reason)
				}
				w, ok := tt.want[f.Check]
				if !ok {
					continue
				}
				if f.Status != w.status || f.Pass != (w.status == pass) || !strings.Contains(f.Reason, w.reason) {
					t.Errorf("%s = %s (pass %v) %q; want %s with %q", f.Check, f.Status, f.Pass, f.Reason, w.status, w.reason)
				}
				if f.Status != pass && f.Action == "" && f.Check != CheckPCIeLink {
					t.Errorf("%s: %s without an action", f.Check, f.Status)
				}
			}
		})
	}
}

func TestNormalizeBusID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"00000000:17:00.0", "0000:17:00.0"},
		{"0000:17:00.0", "0000:17:00.0"},
		{"00000000:2A:00.0", "0000:2a:00.0"},
		{"0000:2a:00", "0000:2a:00"},
		{"0001:c1:1f.7", "0001:c1:1f.7"},
		{"GPU-abc", "gpu-abc"},
		{"0000:zz:00.0", "0000:zz:00.0"},
		{"100000000:00:00.0", "100000000:00:00.0"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := NormalizeBusID(tt.in); got != tt.want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestCheckRules: each rule of the checks, on small records: the PCIe link
// against its slot and the width first seen this boot, NVLinks against
// their peers and MIG mode, page retirement, the driver's recovery action
// and repairs, and the Xid table's severities.
func TestCheckRules(t *testing.T) {
	link := func(w, max, slot, first int) GPU {
		return GPU{Info: Info{UUID: "GPU-l", PCIe: PCIe{GenMax: 4, WidthMax: max, WidthCurrent: w, SlotWidthMax: slot, FirstWidth: first}}}
	}
	nv := func(uuid string, states ...bool) GPU {
		g := GPU{Info: Info{UUID: uuid}}
		for i, a := range states {
			g.NVLinks = append(g.NVLinks, NVLink{Link: i, Active: a, SpeedGBps: 25})
		}
		return g
	}
	on := func(n int) []bool {
		s := make([]bool, n)
		for i := range s {
			s[i] = true
		}
		return s
	}
	mig := nv("GPU-m", false, false)
	mig.MIG.Current = "Enabled"
	bridged := nv("GPU-t", false, false)
	bridged.Topology = []TopoLink{{Peer: "GPU-x", Link: "NV4"}}

	tests := []struct {
		name   string
		gpus   []GPU // the first is judged; the rest are its peers
		xids   []XID
		check  string
		status Status
		reason string
	}{
		{"x8 GPU in a x8 slot", []GPU{link(8, 16, 8, 8)}, nil, CheckPCIeLink, StatusPass, "x8, the width of its slot (the GPU supports x16)"},
		{"x8 GPU, slot unknown", []GPU{link(8, 16, 0, 8)}, nil, CheckPCIeLink, StatusWarn, "the slot's width is unknown"},
		{"x8 in a x16 slot", []GPU{link(8, 16, 16, 8)}, nil, CheckPCIeLink, StatusFail, "below the x16 both the GPU and its slot support"},
		{"x8 in a x16 slot of an x8 GPU", []GPU{link(8, 8, 16, 0)}, nil, CheckPCIeLink, StatusPass, "full width x8"},
		{"narrower than first seen", []GPU{link(4, 16, 0, 8)}, nil, CheckPCIeLink, StatusFail, "narrower than the x8 it trained at earlier this boot"},
		{"narrower than first seen, slot x8", []GPU{link(4, 16, 8, 8)}, nil, CheckPCIeLink, StatusFail, "x4, narrower than the x8"},
		{"no maximum, x16", []GPU{link(16, 0, 0, 0)}, nil, CheckPCIeLink, StatusPass, "full width x16"},
		{"no maximum, x4", []GPU{link(4, 0, 0, 0)}, nil, CheckPCIeLink, StatusWarn, "cannot be told"},

		{"all links up", []GPU{nv("GPU-a", on(12)...), nv("GPU-b", on(12)...)}, nil, CheckNVLink, StatusPass, "all 12 NVLinks active"},
		{"links 3 and 5 down", []GPU{nv("GPU-a", true, true, true, false, true, false)}, nil, CheckNVLink, StatusFail, "NVLinks 3, 5 inactive (4 of 6 active)"},
		{"fewer than the peers", []GPU{nv("GPU-a", on(10)...), nv("GPU-b", on(12)...)}, nil, CheckNVLink, StatusFail, "10 active NVLinks, fewer than the 12 of GPU-b"},
		{"all down while peers are up", []GPU{nv("GPU-a", false, false), nv("GPU-b", true, true)}, nil, CheckNVLink, StatusFail, "NVLinks 0, 1 inactive"},
		{"none reported while peers are up", []GPU{nv("GPU-a"), nv("GPU-b", true)}, nil, CheckNVLink, StatusFail, "reports no NVLink on this GPU while GPU-b has 1 active"},
		{"no bridge anywhere", []GPU{nv("GPU-a", false, false), nv("GPU-b", false, false)}, nil, CheckNVLink, StatusPass, "none of its 2 NVLinks is connected"},
		{"down but the topology says NVLink", []GPU{bridged}, nil, CheckNVLink, StatusFail, "NVLinks 0, 1 inactive"},
		{"MIG", []GPU{mig, nv("GPU-b", true, true)}, nil, CheckNVLink, StatusPass, "MIG mode"},
		{"no NVLink", []GPU{nv("GPU-a")}, nil, CheckNVLink, StatusPass, "no NVLink on this GPU"},

		{"retirement pending", []GPU{{Info: Info{UUID: "GPU-r", RetiredPages: RetiredPages{Supported: true, SingleBit: 2, Pending: true}}}}, nil,
			CheckRetiredPages, StatusWarn, "takes effect at the next GPU reset or reboot (2 pages retired so far)"},
		{"retirement at the limit", []GPU{{Info: Info{UUID: "GPU-r", RetiredPages: RetiredPages{Supported: true, SingleBit: 40, DoubleBit: 24, Pending: true}}}}, nil,
			CheckRetiredPages, StatusFail, "64 pages retired (40 for single-bit, 24 for double-bit errors): the driver's limit of 64"},
		{"some retired", []GPU{{Info: Info{UUID: "GPU-r", RetiredPages: RetiredPages{Supported: true, DoubleBit: 3}}}}, nil,
			CheckRetiredPages, StatusPass, "no page retirement pending (3 pages retired)"},

		{"recovery reset", []GPU{{Info: Info{UUID: "GPU-x", RecoveryAction: "Reset"}}}, nil, CheckRecoveryAction, StatusFail, "recovery action is Reset"},
		{"recovery drain", []GPU{{Info: Info{UUID: "GPU-x", RecoveryAction: "Drain and Reset"}}}, nil, CheckRecoveryAction, StatusFail, "Drain and Reset"},
		{"channel repair", []GPU{{Info: Info{UUID: "GPU-x", Repair: Repair{ChannelPending: true, TPCPending: true}}}}, nil, CheckRepair, StatusWarn, "a channel repair and a TPC repair waits"},
		{"unrepairable", []GPU{{Info: Info{UUID: "GPU-x", Repair: Repair{UnrepairableMemory: true, TPCPending: true}}}}, nil, CheckRepair, StatusFail, "cannot repair"},

		{"application Xid", []GPU{{Info: Info{UUID: "GPU-x"}}}, []XID{{Code: 13, UUID: "GPU-x"}, {Code: 31, UUID: "GPU-x"}}, CheckXIDRecent, StatusWarn, "2 XIDs this boot: 13, 31"},
		{"fallen off the bus", []GPU{{Info: Info{UUID: "GPU-x"}}}, []XID{{Code: 13, UUID: "GPU-x"}, {Code: 79, UUID: "GPU-x"}}, CheckXIDRecent, StatusFail, "(79 the GPU has fallen off the bus; 13 "},
		{"unknown Xid", []GPU{{Info: Info{UUID: "GPU-x"}}}, []XID{{Code: 999, UUID: "GPU-x"}}, CheckXIDRecent, StatusWarn, "Xid 999 is not in bcd's table"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got *Finding
			for _, f := range CheckAll(tt.gpus, tt.xids) {
				if f.GPU == gpuName(tt.gpus[0]) && f.Check == tt.check {
					got = &f
					break
				}
			}
			if got == nil {
				t.Fatalf("no %s finding", tt.check)
			}
			if got.Status != tt.status || !strings.Contains(got.Reason, tt.reason) {
				t.Errorf("%s = %s %q; want %s with %q", tt.check, got.Status, got.Reason, tt.status, tt.reason)
			}
			if (got.Status == StatusPass) != got.Pass {
				t.Errorf("pass %v with status %s", got.Pass, got.Status)
			}
		})
	}
}
