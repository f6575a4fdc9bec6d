package nvsmi

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func seed(f *testing.F, glob string) {
	files, err := filepath.Glob(filepath.Join("testdata", glob))
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

func FuzzParseXML(f *testing.F) {
	seed(f, "*.xml")
	f.Add([]byte(faultyXML))
	f.Add([]byte("<nvidia_smi_log><gpu><remapped_rows>N/A</remapped_rows></gpu></nvidia_smi_log>"))
	// The fields of newer drivers, set.
	f.Add([]byte("<nvidia_smi_log><gpu><uuid>GPU-1</uuid><gpu_recovery_action>Drain and Reset</gpu_recovery_action>" +
		"<ecc_errors><channel_repair_pending>Yes</channel_repair_pending><tpc_repair_pending>Yes</tpc_repair_pending>" +
		"<unrepairable_memory>Yes</unrepairable_memory></ecc_errors><retired_pages><pending_blacklist>Yes</pending_blacklist>" +
		"<multiple_single_bit_retirement><retired_count>64</retired_count></multiple_single_bit_retirement></retired_pages>" +
		"<pci><pci_gpu_link_info><link_widths><max_link_width>16x</max_link_width><current_link_width>[Unknown Error]</current_link_width></link_widths></pci_gpu_link_info></pci>" +
		"</gpu><gpu><uuid>Not Found</uuid></gpu></nvidia_smi_log>"))
	f.Fuzz(func(t *testing.T, b []byte) {
		gpus, err := ParseXML(bytes.NewReader(b))
		if err != nil {
			return
		}
		for _, g := range gpus {
			if _, err := json.Marshal(g); err != nil {
				t.Fatalf("record does not encode: %v", err)
			}
		}
		checkFindings(t, gpus, CheckAll(gpus, []XID{{Code: 79, PCIBusID: "0000:17:00"}, {Code: 13}}))
	})
}

func FuzzParseTopo(f *testing.F) {
	seed(f, "topo-m.*")
	f.Add([]byte(hgxTopo))
	f.Add([]byte("\tGPU0\tNIC0\n\x1b[4mGPU0\t X\nNIC Legend:\n  NIC0: mlx5_0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		top, err := ParseTopo(bytes.NewReader(b))
		if err != nil {
			return
		}
		gpus := []GPU{{Info: Info{Index: 0, UUID: "GPU-a"}}, {Info: Info{Index: 1}}}
		ApplyTopology(gpus, top)
	})
}

func FuzzParseNVLink(f *testing.F) {
	seed(f, "nvlink-s.*")
	f.Add([]byte("GPU 0: X (UUID: GPU-1)\n\t Link 0: <inactive>\n\t Link 1: 25 GB/s\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseNVLink(bytes.NewReader(b))
		if err != nil {
			return
		}
		if _, err := json.Marshal(st); err != nil {
			t.Fatalf("status does not encode: %v", err)
		}
		gpus := []GPU{{Info: Info{Index: 0, UUID: "GPU-a"}}, {Info: Info{Index: 1}}, {Info: Info{Index: 2, UUID: "GPU-c"}}}
		applyNVLink(gpus, st)
		checkFindings(t, gpus, CheckAll(gpus, nil))
	})
}

func FuzzParseList(f *testing.F) {
	seed(f, "L.*")
	f.Add([]byte(lgip))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseList(bytes.NewReader(b))
		_, _ = ParseMIGProfiles(bytes.NewReader(b))
		_, _ = ParseComputeCap(bytes.NewReader(b))
	})
}

// checkFindings: every GPU gets one finding per check, each with a known
// status that agrees with Pass and a reason.
func checkFindings(t *testing.T, gpus []GPU, fs []Finding) {
	t.Helper()
	if len(fs) != len(gpus)*len(Checks) {
		t.Fatalf("%d findings for %d GPUs", len(fs), len(gpus))
	}
	for _, f := range fs {
		switch f.Status {
		case StatusPass, StatusWarn, StatusFail:
		default:
			t.Fatalf("%s: status %q", f.Check, f.Status)
		}
		if f.Pass != (f.Status == StatusPass) || f.Reason == "" {
			t.Fatalf("%+v", f)
		}
	}
}
