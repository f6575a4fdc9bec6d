package nodekinds_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/machine/doctor"
	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nodekinds"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// captureHW is a machine whose nvidia-smi is a real process, a script
// that prints committed captures, with the XIDs of its boot.
type captureHW struct {
	smi  string
	xids []nvsmi.XID
}

func (h captureHW) SMI() nvsmi.Runner { return nvsmi.ExecRunner(h.smi) }
func (h captureHW) Inventory(ctx context.Context) (*inventory.Inventory, error) {
	inv, err := inventory.Collect(ctx, inventory.Options{SMI: h.SMI()})
	if err == nil {
		inv.Seal()
	}
	return inv, err
}
func (h captureHW) XIDs(context.Context) ([]nvsmi.XID, error) { return h.xids, nil }
func (h captureHW) ResetGPU(context.Context, nvsmi.GPU) error { return nil }

// fakeSMI writes an nvidia-smi that answers -q -x with the capture xml and
// the driver query with driver.
func fakeSMI(t *testing.T, xml, driver string) string {
	t.Helper()
	dir := t.TempDir()
	capture, err := filepath.Abs(filepath.Join("..", "nvsmi", "testdata", xml))
	if err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\ncase \"$*\" in\n" +
		"\"-q -x\") cat '" + capture + "' ;;\n" +
		"\"--query-gpu=driver_version --format=csv,noheader\") echo " + driver + "; echo " + driver + " ;;\n" +
		"*) exit 0 ;;\nesac\n"
	p := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOneVerdictPath: diag.nvml, bcd doctor's gpu lines, bcd hardware
// --json and bcd status's GPU lines give each GPU the same verdict, over a
// fake nvidia-smi printing a real capture: two RTX 2070 at x8 of x16 (slot
// unknown: a warning each) and an Xid 79 on the second (a failure).
func TestOneVerdictPath(t *testing.T) {
	const first, second = "GPU-12345678-aaaa-bbbb-cccc-0123456789ab", "GPU-12345678-aaaa-bbbb-cccc-0123456789cd"
	hw := captureHW{smi: fakeSMI(t, "dual-rtx-2070.590.44.01.xml", "590.44.01"),
		xids: []nvsmi.XID{{Code: 79, PCIBusID: "0000:02:00", Message: "GPU has fallen off the bus."}}}
	want := map[string]nvsmi.Status{first: nvsmi.StatusWarn, second: nvsmi.StatusFail}
	ctx := context.Background()

	// diag.nvml
	out, err := kind(t, nodekinds.Kinds(hw, nil), "diag.nvml").Run(ctx, nil)
	var res nodekinds.DiagResult
	if jerr := json.Unmarshal(out, &res); jerr != nil || err == nil || res.Pass || res.GPUs != 2 || res.Driver != "590.44.01" {
		t.Fatalf("diag.nvml: %v %v %+v", err, jerr, res)
	}
	if !strings.Contains(err.Error(), second+" xid.recent") || strings.Contains(err.Error(), first) {
		t.Errorf("diag.nvml's failure names the wrong checks: %v", err)
	}
	diag := map[string][]nvsmi.Finding{}
	for _, f := range res.Findings {
		if f.GPU != "" {
			diag[f.GPU] = append(diag[f.GPU], f)
		}
	}
	for uuid, st := range want {
		if got := nvsmi.Worst(diag[uuid]); got != st {
			t.Errorf("diag.nvml: %s is %s, want %s", uuid, got, st)
		}
	}

	// bcd doctor
	var gpuLines []doctor.Result
	for _, r := range doctor.Collect(ctx, nodekinds.DoctorChecks(hw, "test")) {
		if r.Name == "gpu" {
			gpuLines = append(gpuLines, r)
		}
	}
	docStatus := map[nvsmi.Status]doctor.Status{nvsmi.StatusPass: doctor.OK, nvsmi.StatusWarn: doctor.Warn, nvsmi.StatusFail: doctor.Fail}
	if len(gpuLines) != 2 {
		t.Fatalf("doctor gpu lines: %+v", gpuLines)
	}
	for i, uuid := range []string{first, second} {
		r := gpuLines[i]
		if r.Status != docStatus[want[uuid]] || !strings.HasPrefix(r.Detail, uuid[:8]+"… NVIDIA GeForce RTX 2070: ") {
			t.Errorf("doctor line %d: %+v, want %s for %s", i, r, want[uuid], uuid)
		}
	}
	if !strings.Contains(gpuLines[1].Detail, "Xid") && !strings.Contains(gpuLines[1].Detail, "fallen off the bus") {
		t.Errorf("doctor's failing line does not say why: %s", gpuLines[1].Detail)
	}
	if !strings.Contains(gpuLines[0].Detail, "x8 of the GPU's x16") {
		t.Errorf("doctor's warning does not say why: %s", gpuLines[0].Detail)
	}

	// bcd hardware --json
	var stdout, stderr bytes.Buffer
	env := &cli.Env{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	cmd := nodekinds.HardwareCommand(func(string) (nodekinds.Hardware, string) { return hw, "test" })
	if code := cmd.Run(ctx, env, []string{"--json", "--config", filepath.Join(t.TempDir(), "none.toml")}); code != 0 {
		t.Fatalf("bcd hardware --json = %d: %s", code, stderr.String())
	}
	var inv inventory.Inventory
	if err := json.Unmarshal(stdout.Bytes(), &inv); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, s := range inv.Live.GPUs {
		if st, ok := want[s.UUID]; ok {
			seen++
			if got := nvsmi.Worst(s.Findings); got != st || len(s.Findings) != len(nvsmi.Checks) {
				t.Errorf("bcd hardware --json: %s is %s with %d findings, want %s", s.UUID, got, len(s.Findings), st)
			}
		}
	}
	if seen != 2 {
		t.Errorf("bcd hardware --json judged %d GPUs: %+v", seen, inv.Live.GPUs)
	}

	// bcd hardware, as text: each GPU line ends with its verdict.
	stdout.Reset()
	if code := cmd.Run(ctx, env, []string{"--config", filepath.Join(t.TempDir(), "none.toml")}); code != 0 {
		t.Fatalf("bcd hardware = %d: %s", code, stderr.String())
	}
	for uuid, st := range want {
		if !strings.Contains(stdout.String(), uuid+" NVIDIA GeForce RTX 2070: "+string(st)+": ") {
			t.Errorf("bcd hardware does not give %s its verdict %s:\n%s", uuid, st, stdout.String())
		}
	}

	// bcd status
	statusWant := map[nvsmi.Status]string{nvsmi.StatusWarn: status.HealthWarn, nvsmi.StatusFail: status.HealthUnhealthy}
	gpus := nodekinds.StatusGPUs(hw)(ctx)
	if len(gpus) != 2 {
		t.Fatalf("status GPUs: %+v", gpus)
	}
	for _, g := range gpus {
		if g.Health != statusWant[want[g.UUID]] || len(g.Problems) == 0 {
			t.Errorf("bcd status: %s is %q %v, want %s", g.UUID, g.Health, g.Problems, statusWant[want[g.UUID]])
		}
	}
	var text bytes.Buffer
	status.Render(&text, status.Snapshot{GPUs: gpus})
	if !strings.Contains(text.String(), "1 "+second+" NVIDIA GeForce RTX 2070: ") || !strings.Contains(text.String(), "; UNHEALTHY: ") {
		t.Errorf("bcd status does not mark the GPU UNHEALTHY:\n%s", text.String())
	}
}
