package nodekinds_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/machine/fakehw"
	"github.com/better-compute/bcd/components/machine/nodekinds"
)

func kind(t *testing.T, kinds []dispatch.Kind, name string) dispatch.Kind {
	t.Helper()
	for _, k := range kinds {
		if k.Name == name {
			return k
		}
	}
	t.Fatalf("no kind %s", name)
	return dispatch.Kind{}
}

func TestGPUResetRefusesAHeldGPU(t *testing.T) {
	hw := fakehw.Hardware{Seed: 3, DataDir: t.TempDir()}
	held := fakehw.GPUUUID(3, 2)
	reset := kind(t, nodekinds.Kinds(hw, func(uuid string) bool { return uuid == held }), "gpu.reset")
	_, err := reset.Run(context.Background(), []byte(`{"gpu":"`+held+`"}`))
	if err == nil || !strings.Contains(err.Error(), "live hold") {
		t.Fatalf("reset of a held GPU: %v", err)
	}
	out, err := reset.Run(context.Background(), []byte(`{"gpu":"`+fakehw.GPUUUID(3, 1)+`"}`))
	if err != nil || !strings.Contains(string(out), `"healthy":true`) {
		t.Fatalf("reset of a free GPU: %v %s", err, out)
	}
	for _, bad := range []string{``, `{}`, `{"gpu":"x","y":1}`, `[]`} {
		if _, err := reset.Run(context.Background(), []byte(bad)); err == nil {
			t.Errorf("body %q accepted", bad)
		}
	}
}

func TestDiagNVMLWithoutDriver(t *testing.T) {
	diag := kind(t, nodekinds.Kinds(nodekinds.Host{NvidiaSMI: "/nonexistent/nvidia-smi", DataDir: t.TempDir()}, nil), "diag.nvml")
	out, err := diag.Run(context.Background(), nil)
	var res nodekinds.DiagResult
	if jerr := json.Unmarshal(out, &res); jerr != nil || err == nil || res.Pass || !strings.Contains(err.Error(), "nvml.init") {
		t.Fatalf("diag without a driver: %v %+v %v", err, res, jerr)
	}
}
