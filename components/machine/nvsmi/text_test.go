package nvsmi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	tests := []struct {
		name string
		in   func(t *testing.T) string
		want []Listed
	}{
		{
			name: "H100 in MIG mode (capture)",
			in:   func(t *testing.T) string { return readFile(t, "L.h100-mig.590.48.01.txt") },
			want: []Listed{{
				Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-00000000-0000-0000-0000-000000000000",
				MIG: []ListedMIG{
					{Profile: "3g.40gb", Device: 0, UUID: "MIG-00000000-0000-0000-0000-000000000000"},
					{Profile: "2g.20gb", Device: 1, UUID: "MIG-00000001-0000-0000-0000-000000000001"},
					{Profile: "1g.10gb", Device: 2, UUID: "MIG-00000002-0000-0000-0000-000000000002"},
					{Profile: "1g.10gb", Device: 3, UUID: "MIG-00000003-0000-0000-0000-000000000003"},
				},
			}},
		},
		{
			name: "two GPUs",
			in: func(*testing.T) string {
				return "GPU 0: Tesla T4 (UUID: GPU-aaaa)\nGPU 1: NVIDIA A10 (UUID: GPU-bbbb)\n"
			},
			want: []Listed{{Index: 0, Name: "Tesla T4", UUID: "GPU-aaaa"}, {Index: 1, Name: "NVIDIA A10", UUID: "GPU-bbbb"}},
		},
		{
			name: "no devices",
			in:   func(*testing.T) string { return "No devices found.\n" },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseList(strings.NewReader(tt.in(t)))
			if err != nil {
				t.Fatal(err)
			}
			diff(t, got, tt.want)
		})
	}
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseComputeCap(t *testing.T) {
	in := "GPU-aaaa, 9.0\nGPU-bbbb, [N/A]\n\nGPU-cccc,8.0\ngarbage\n"
	got, err := ParseComputeCap(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	diff(t, got, map[string]string{"GPU-aaaa": "9.0", "GPU-cccc": "8.0"})
}

func links(n int, speed float64) []NVLink {
	var l []NVLink
	for i := 0; i < n; i++ {
		l = append(l, NVLink{Link: i, Active: true, SpeedGBps: speed})
	}
	return l
}

func TestParseNVLink(t *testing.T) {
	t.Run("H100 (capture)", func(t *testing.T) {
		got, err := ParseNVLink(open(t, "nvlink-s.h100-80gb-hbm3.590.48.01.txt"))
		if err != nil {
			t.Fatal(err)
		}
		diff(t, got, []NVLinkStatus{{Index: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000", Links: links(18, 26.562)}})
	})
	t.Run("H100 in MIG mode (capture)", func(t *testing.T) {
		got, err := ParseNVLink(open(t, "nvlink-s.h100-mig.590.48.01.txt"))
		if err != nil {
			t.Fatal(err)
		}
		diff(t, got, []NVLinkStatus{{Index: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000",
			Note: "Nvlink queries are not supported for Devices in MIG mode"}})
	})
	t.Run("8x A100 (capture)", func(t *testing.T) {
		got, err := ParseNVLink(open(t, "nvlink-s.a100-sxm4-80gb-x8.txt"))
		if err != nil {
			t.Fatal(err)
		}
		uuids := []string{
			"GPU-5269b708-678a-b1a8-60f0-c90406537486", "GPU-a7605225-d684-1f65-4ad4-ee2ab39338b4",
			"GPU-483e6bb6-bb11-8916-e22f-d1d69abbafaa", "GPU-6e4fbadc-10d9-a63a-8988-9a0d320ff1a0",
			"GPU-82ef2c67-965f-a411-1413-f5e1d756bcdb", "GPU-375df896-019b-a009-42e5-ce9ed21bd8cc",
			"GPU-68d0f80e-e2f6-7717-ce0c-ea5f17b6a180", "GPU-754035b4-4708-efcd-b261-623aea38bcad",
		}
		var want []NVLinkStatus
		for i, u := range uuids {
			want = append(want, NVLinkStatus{Index: i, UUID: u, Links: links(12, 25)})
		}
		diff(t, got, want)
	})
	t.Run("inactive links (documented format)", func(t *testing.T) {
		in := "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n" +
			"GPU 1: NVIDIA GeForce RTX 4090 (UUID: GPU-2)\n"
		got, err := ParseNVLink(strings.NewReader(in))
		if err != nil {
			t.Fatal(err)
		}
		diff(t, got, []NVLinkStatus{
			{Index: 0, UUID: "GPU-1", Links: []NVLink{{Link: 0, Active: true, SpeedGBps: 26.562}, {Link: 1}}},
			{Index: 1, UUID: "GPU-2"},
		})
	})
}

// hgxTopo is a small matrix written in the documented `topo -m` format
// (tab separated, an empty column before GPU NUMA ID, NIC rows without
// affinity, and the NIC legend), not a capture.
const hgxTopo = "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" +
	"GPU0\t X \tNV18\tNV18\tNV18\tPIX\tSYS\t0-31,64-95\t0\t\tN/A\n" +
	"GPU1\tNV18\t X \tNV18\tNV18\tNODE\tSYS\t0-31,64-95\t0\t\tN/A\n" +
	"GPU2\tNV18\tNV18\t X \tNV18\tSYS\tPIX\t32-63,96-127\t1\t\tN/A\n" +
	"GPU3\tNV18\tNV18\tNV18\t X \tSYS\tNODE\t32-63,96-127\t1\t\tN/A\n" +
	"NIC0\tPIX\tNODE\tSYS\tSYS\t X \tSYS\t\t\t\t\n" +
	"NIC1\tSYS\tSYS\tPIX\tNODE\tSYS\t X \t\t\t\t\n" +
	"\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n" +
	"  NV#  = Connection traversing a bonded set of # NVLinks\n" +
	"\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n\n"

func TestParseTopo(t *testing.T) {
	t.Run("H100 (capture, ANSI underlined header)", func(t *testing.T) {
		got, err := ParseTopo(open(t, "topo-m.h100-80gb-hbm3.590.48.01.txt"))
		if err != nil {
			t.Fatal(err)
		}
		diff(t, got, Topology{
			Columns: []string{"GPU0"},
			Rows: []TopoRow{{Device: "GPU0", Links: map[string]string{"GPU0": "X"},
				CPUAffinity: "0-19", NUMAAffinity: "0", GPUNUMAID: ""}},
		})
	})
	t.Run("four GPUs and two NICs", func(t *testing.T) {
		got, err := ParseTopo(strings.NewReader(hgxTopo))
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Rows) != 6 || len(got.Columns) != 6 {
			t.Fatalf("got %d rows, %d columns", len(got.Rows), len(got.Columns))
		}
		diff(t, got.NICs, map[string]string{"NIC0": "mlx5_0", "NIC1": "mlx5_1"})
		diff(t, got.Rows[2], TopoRow{Device: "GPU2",
			Links:       map[string]string{"GPU0": "NV18", "GPU1": "NV18", "GPU2": "X", "GPU3": "NV18", "NIC0": "SYS", "NIC1": "PIX"},
			CPUAffinity: "32-63,96-127", NUMAAffinity: "1", GPUNUMAID: ""})
		diff(t, got.Rows[4], TopoRow{Device: "NIC0",
			Links: map[string]string{"GPU0": "PIX", "GPU1": "NODE", "GPU2": "SYS", "GPU3": "SYS", "NIC0": "X", "NIC1": "SYS"}})

		gpus := []GPU{{Info: Info{Index: 0, UUID: "GPU-a"}}, {Info: Info{Index: 1, UUID: "GPU-b"}},
			{Info: Info{Index: 2, UUID: "GPU-c"}}, {Info: Info{Index: 3, UUID: "GPU-d"}}}
		ApplyTopology(gpus, got)
		diff(t, gpus[2].Topology, []TopoLink{
			{Peer: "GPU-a", Link: "NV18"}, {Peer: "GPU-b", Link: "NV18"}, {Peer: "GPU-d", Link: "NV18"},
			{Peer: "mlx5_0", Link: "SYS"}, {Peer: "mlx5_1", Link: "PIX"},
		})
		if gpus[2].CPUAffinity != "32-63,96-127" || gpus[2].NUMAAffinity != "1" {
			t.Errorf("affinity %q %q", gpus[2].CPUAffinity, gpus[2].NUMAAffinity)
		}
	})
	t.Run("spaces instead of tabs (older driver, copied from a terminal)", func(t *testing.T) {
		in := "        GPU0    GPU1    CPU Affinity    NUMA Affinity\nGPU0     X      PHB     0-11            N/A\nGPU1    PHB      X      0-11            N/A\n"
		got, err := ParseTopo(strings.NewReader(in))
		if err != nil {
			t.Fatal(err)
		}
		diff(t, got, Topology{
			Columns: []string{"GPU0", "GPU1"},
			Rows: []TopoRow{
				{Device: "GPU0", Links: map[string]string{"GPU0": "X", "GPU1": "PHB"}, CPUAffinity: "0-11", NUMAAffinity: ""},
				{Device: "GPU1", Links: map[string]string{"GPU0": "PHB", "GPU1": "X"}, CPUAffinity: "0-11", NUMAAffinity: ""},
			},
		})
	})
}

// lgip is written in the documented `nvidia-smi mig -lgip` table format,
// not a capture.
const lgip = `+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.10gb       19     7/7        9.50       No     14     0     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.10gb+me    20     1/1        9.50       No     14     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   0  MIG 3g.40gb        9     0/2        39.25      No     60     3     0   |
|                                                             3     0     0   |
+-----------------------------------------------------------------------------+
|   1  MIG 7g.80gb        0     1/1        79.25      No     132    7     0   |
|                                                             8     7     1   |
+-----------------------------------------------------------------------------+
`

func TestParseMIGProfiles(t *testing.T) {
	got, err := ParseMIGProfiles(strings.NewReader(lgip))
	if err != nil {
		t.Fatal(err)
	}
	diff(t, got, []MIGProfile{
		{GPU: 0, Name: "1g.10gb", ID: 19, Free: 7, Total: 7, MemoryGiB: 9.5},
		{GPU: 0, Name: "1g.10gb+me", ID: 20, Free: 1, Total: 1, MemoryGiB: 9.5},
		{GPU: 0, Name: "3g.40gb", ID: 9, Free: 0, Total: 2, MemoryGiB: 39.25},
		{GPU: 1, Name: "7g.80gb", ID: 0, Free: 1, Total: 1, MemoryGiB: 79.25},
	})
}
