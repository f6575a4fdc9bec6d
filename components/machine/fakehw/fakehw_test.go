package fakehw

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

func TestMachineDeterministic(t *testing.T) {
	a, b := Machine(1), Machine(1)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Fatal("Machine(1) differs between two calls")
	}
	if !reflect.DeepEqual(a.Sections(), b.Sections()) || a.Hash != b.Hash {
		t.Fatal("Machine(1) sections or hashes differ between two calls")
	}

	c := Machine(2)
	if c.Hash == a.Hash {
		t.Fatal("seeds 1 and 2 make the same machine")
	}
	// What the seed derives differs; what it does not stays the same.
	for name, want := range map[string]bool{
		inventory.SectionSystem: true, inventory.SectionDisks: true, inventory.SectionNICs: true,
		inventory.SectionGPUs: true, inventory.SectionOS: true,
		inventory.SectionCPU: false, inventory.SectionMemory: false, inventory.SectionKVM: false,
	} {
		if differs := a.SectionHashes[name] != c.SectionHashes[name]; differs != want {
			t.Errorf("section %s differs between seeds: %v, want %v", name, differs, want)
		}
	}
	if a.System.Serial == c.System.Serial || a.System.ProductUUID == c.System.ProductUUID || a.GPUs[0].UUID == c.GPUs[0].UUID {
		t.Error("serial, product UUID or GPU UUID does not depend on the seed")
	}
	if GPUUUID(1, 0) == GPUUUID(1, 1) || GPUUUID(-5, 0) == GPUUUID(5, 0) {
		t.Error("GPU UUIDs collide")
	}
}

func TestMachineShape(t *testing.T) {
	inv := Machine(7)
	if inv.Schema != inventory.Schema || len(inv.SectionHashes) != 10 || inv.Hash != inventory.OverallHash(inv.SectionHashes) {
		t.Fatalf("schema %q, hashes %v, hash %s", inv.Schema, inv.SectionHashes, inv.Hash)
	}
	if inv.CPU.Sockets != 2 || len(inv.CPU.NUMA) != 2 || inv.Memory.TotalBytes != 2<<40 {
		t.Errorf("cpu %+v memory %+v", inv.CPU, inv.Memory)
	}
	rdma := 0
	for _, n := range inv.NICs {
		if n.RDMA && n.PCIDevice == "0x1021" && n.SpeedMbps == 400000 {
			rdma++
		}
	}
	if rdma != 8 || len(inv.Disks) != 10 {
		t.Errorf("%d ConnectX-7 RDMA NICs, %d disks", rdma, len(inv.Disks))
	}
	if len(inv.GPUs) != GPUCount || len(inv.Live.GPUs) != GPUCount {
		t.Fatalf("%d GPUs, %d samples", len(inv.GPUs), len(inv.Live.GPUs))
	}
	uuids := map[string]bool{}
	for _, g := range inv.GPUs {
		uuids[g.UUID] = true
		s := g.SMI
		if s == nil || g.Model != GPUName || s.MemoryTotalMiB != 81559 || len(s.NVLinks) != 18 || s.RowRemap == nil {
			t.Fatalf("GPU %+v", g)
		}
		nv := 0
		for _, l := range s.Topology {
			if l.Link == "NV18" && strings.HasPrefix(l.Peer, "GPU-") {
				nv++
			}
		}
		if nv != GPUCount-1 {
			t.Errorf("GPU %s reaches %d GPUs over NVLink, want %d", g.UUID, nv, GPUCount-1)
		}
		for _, f := range nvsmi.Check(nvsmi.GPU{Info: *s}, nil) {
			if !f.Pass {
				t.Errorf("GPU %s fails %s: %s", g.UUID, f.Check, f.Reason)
			}
		}
	}
	if len(uuids) != GPUCount {
		t.Errorf("GPU UUIDs are not distinct: %v", uuids)
	}
}

// TestNvidiaSMIRoundTrip: nvsmi parses the fake nvidia-smi's output back to
// the same GPUs, and an inventory completed from it hashes like Machine.
func TestNvidiaSMIRoundTrip(t *testing.T) {
	for _, seed := range []int64{1, 42, -3, MIGSeed(5, 0, 6)} {
		run := NvidiaSMI(seed)
		got, err := nvsmi.Collect(context.Background(), run)
		if err != nil {
			t.Fatalf("seed %d: Collect: %v", seed, err)
		}
		want := GPUs(seed)
		if !reflect.DeepEqual(got, want) {
			for i := range want {
				if i < len(got) && !reflect.DeepEqual(got[i], want[i]) {
					g, _ := json.MarshalIndent(got[i], "", " ")
					w, _ := json.MarshalIndent(want[i], "", " ")
					t.Fatalf("seed %d GPU %d: got\n%s\nwant\n%s", seed, i, g, w)
				}
			}
			t.Fatalf("seed %d: got %d GPUs, want %d", seed, len(got), len(want))
		}

		m := Machine(seed)
		inv := *m
		inv.GPUs = nil
		inv.Live = inventory.Live{}
		for _, g := range m.GPUs {
			g.SMI = nil
			inv.GPUs = append(inv.GPUs, g)
		}
		inv.MergeSMI(got)
		if !reflect.DeepEqual(inv.Hashes(), m.SectionHashes) {
			t.Errorf("seed %d: an inventory completed from the fake nvidia-smi hashes differently", seed)
		}

		driver, n, err := nvsmi.Probe(context.Background(), run)
		if err != nil || driver != DriverVersion || n != GPUCount {
			t.Errorf("Probe = %q, %d, %v", driver, n, err)
		}
	}
	mig := GPUs(MIGSeed(5, 0, 6))
	for i, g := range mig {
		if n := len(g.MIG.Devices); (i == 0 || i == 6) != (n == 3 && g.MIG.Current == "Enabled") || (n > 0 && g.MIG.Devices[1].UUID != MIGUUID(MIGSeed(5, 0, 6), i, 1)) {
			t.Errorf("MIGSeed(5, 0, 6): GPU %d has MIG %s with %d devices", i, g.MIG.Current, n)
		}
	}
	if _, err := NvidiaSMI(1)(context.Background(), "--bogus"); err == nil {
		t.Error("an unknown argument succeeded")
	}
}

// TestMachineGolden pins Machine(1): its sections and hashes are what the
// FakeDaemon must reproduce. After a deliberate change, rewrite the file
// with BCD_UPDATE_GOLDEN=1 go test ./components/machine/fakehw/.
func TestMachineGolden(t *testing.T) {
	m := Machine(1)
	secs := m.Sections()
	golden := struct {
		Sections map[string]string `json:"sections"` // the canonical bytes
		Hashes   map[string]string `json:"hashes"`
		Hash     string            `json:"hash"`
	}{Sections: map[string]string{}, Hashes: m.SectionHashes, Hash: m.Hash}
	for k, v := range secs {
		golden.Sections[k] = string(v)
	}
	got, err := json.MarshalIndent(golden, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "machine-seed-1.json")
	if os.Getenv("BCD_UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (write it with BCD_UPDATE_GOLDEN=1)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Machine(1) no longer matches %s; if the change is deliberate, rewrite it with BCD_UPDATE_GOLDEN=1 and tell the FakeDaemon", path)
	}
}
