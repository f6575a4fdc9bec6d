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
	f.Fuzz(func(t *testing.T, b []byte) {
		gpus, err := ParseXML(bytes.NewReader(b))
		if err != nil {
			return
		}
		for _, g := range gpus {
			if _, err := json.Marshal(g); err != nil {
				t.Fatalf("record does not encode: %v", err)
			}
			Check(g, []XID{{Code: 79, PCIBusID: g.PCIBusID}})
		}
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
