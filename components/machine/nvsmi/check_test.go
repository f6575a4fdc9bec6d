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
		pass   bool
		reason string // a part of the reason
	}
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
				CheckECCUncorrectable: {false, "3 uncorrectable ECC errors since the driver loaded (DRAM 2, SRAM 1; 7 over"},
				CheckRowRemapPending:  {false, "a row remap waits for a GPU reset"},
				CheckRowRemapFailure:  {false, "row remapping failed"},
				CheckPCIeLink:         {false, "x8, narrower than its maximum x16"},
				CheckXIDRecent:        {false, "2 XIDs this boot: 48, 79"},
			},
		},
		{
			name: "healthy H100",
			gpu:  healthy,
			xids: []XID{{Code: 79, PCIBusID: "0000:18:00"}},
			want: map[string]want{
				CheckECCUncorrectable: {true, "no uncorrectable ECC errors"},
				CheckRowRemapPending:  {true, "no row remap waits"},
				CheckRowRemapFailure:  {true, "no row remapping failure"},
				CheckPCIeLink:         {true, "full width x16"},
				CheckXIDRecent:        {true, "no XID this boot"},
			},
		},
		{
			name: "XID matched by UUID",
			gpu:  healthy,
			xids: []XID{{Code: 94, UUID: "GPU-5f1caaaa-0000-1111-2222-333344445555"}},
			want: map[string]want{CheckXIDRecent: {false, "1 XIDs this boot: 94"}},
		},
		{
			name: "Pascal with single-bit errors and no row remapper (capture)",
			gpu:  p100,
			want: map[string]want{
				CheckECCUncorrectable: {true, "no uncorrectable ECC errors"},
				CheckRowRemapPending:  {true, "no row remapper"},
				CheckRowRemapFailure:  {true, "no row remapper"},
				CheckPCIeLink:         {true, "x16"},
			},
		},
		{
			name: "ECC disabled (capture)",
			gpu:  ada,
			want: map[string]want{CheckECCUncorrectable: {true, "ECC is not enabled"}},
		},
		{
			name: "nothing known",
			gpu:  GPU{Info: Info{PCIBusID: "0000:01:00.0"}},
			want: map[string]want{CheckPCIeLink: {true, "no PCIe link width"}},
		},
	}
	order := []string{CheckECCUncorrectable, CheckRowRemapPending, CheckRowRemapFailure, CheckPCIeLink, CheckXIDRecent}
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
				if f.Pass != w.pass || !strings.Contains(f.Reason, w.reason) {
					t.Errorf("%s = pass %v %q; want pass %v with %q", f.Check, f.Pass, f.Reason, w.pass, w.reason)
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
