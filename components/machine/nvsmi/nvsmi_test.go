package nvsmi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fake replays outputs by command line; a missing command fails.
func fake(outputs map[string]string) Runner {
	return func(_ context.Context, args ...string) ([]byte, error) {
		out, ok := outputs[strings.Join(args, " ")]
		if !ok {
			return nil, errors.New("exit status 2")
		}
		return []byte(out), nil
	}
}

func TestCollect(t *testing.T) {
	const uuid = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
	run := fake(map[string]string{
		"-q -x": readFile(t, "a100-sxm4-80gb-mig.535.54.03.xml"),
		"-L": "GPU 0: NVIDIA A100-SXM4-80GB (UUID: " + uuid + ")\n" +
			"  MIG 1g.20gb     Device  0: (UUID: MIG-0)\n  MIG 1g.20gb     Device  1: (UUID: MIG-1)\n" +
			"  MIG 1g.20gb     Device  2: (UUID: MIG-2)\n  MIG 1g.20gb     Device  3: (UUID: MIG-3)\n",
		"--query-gpu=uuid,compute_cap --format=csv,noheader": uuid + ", 8.0\n",
		"topo -m":   "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-63\t0\t\tN/A\n",
		"mig -lgip": lgip,
		// nvlink -s fails.
	})
	gpus, err := Collect(context.Background(), run)
	if len(gpus) != 1 {
		t.Fatalf("got %d GPUs (err %v), want 1", len(gpus), err)
	}
	if err == nil || !strings.Contains(err.Error(), "nvidia-smi nvlink -s") {
		t.Errorf("err = %v, want one naming nvlink -s", err)
	}
	g := gpus[0]
	if g.ComputeCap != "8.0" || g.CPUAffinity != "0-63" || g.NUMAAffinity != "0" {
		t.Errorf("compute cap %q, affinity %q %q", g.ComputeCap, g.CPUAffinity, g.NUMAAffinity)
	}
	for i, d := range g.MIG.Devices {
		if d.Profile != "1g.20gb" || d.UUID != "MIG-"+string(rune('0'+i)) {
			t.Errorf("MIG device %d = %+v", i, d)
		}
	}
	if len(g.MIG.Profiles) != 3 || g.MIG.Profiles[2].Name != "3g.40gb" {
		t.Errorf("MIG profiles %+v", g.MIG.Profiles)
	}

	t.Run("-q -x fails", func(t *testing.T) {
		gpus, err := Collect(context.Background(), fake(nil))
		if err == nil || gpus != nil {
			t.Fatalf("got %v, %v; want an error and no GPUs", gpus, err)
		}
	})
	t.Run("everything answers", func(t *testing.T) {
		gpus, err := Collect(context.Background(), fake(map[string]string{
			"-q -x": readFile(t, "tesla-p100-pcie-16gb.510.47.03.xml"),
			"-L":    "GPU 0: Tesla P100-PCIE-16GB (UUID: GPU-d3da8716-eaab-75db-efc1-60e88e1cd55e)\n",
			"--query-gpu=uuid,compute_cap --format=csv,noheader": "GPU-d3da8716-eaab-75db-efc1-60e88e1cd55e, 6.0\n",
			"topo -m":   "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-7\tN/A\n",
			"nvlink -s": "",
		}))
		if err != nil || len(gpus) != 1 || gpus[0].ComputeCap != "6.0" {
			t.Fatalf("got %+v, %v", gpus, err)
		}
	})
}

func TestProbe(t *testing.T) {
	tests := []struct {
		name   string
		out    map[string]string
		driver string
		count  int
		err    bool
	}{
		{"eight GPUs", map[string]string{"--query-gpu=driver_version --format=csv,noheader": strings.Repeat("550.54.15\n", 8)}, "550.54.15", 8, false},
		{"no devices", map[string]string{"--query-gpu=driver_version --format=csv,noheader": "No devices were found\n"}, "", 0, true},
		{"fails", nil, "", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, n, err := Probe(context.Background(), fake(tt.out))
			if d != tt.driver || n != tt.count || (err != nil) != tt.err {
				t.Errorf("Probe = %q, %d, %v", d, n, err)
			}
		})
	}
}

func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nvidia-smi")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExecRunner(t *testing.T) {
	ctx := context.Background()
	t.Run("not found", func(t *testing.T) {
		for _, p := range []string{filepath.Join(t.TempDir(), "nvidia-smi"), "bcd-no-such-nvidia-smi"} {
			_, err := ExecRunner(p)(ctx, "-L")
			if !errors.Is(err, ErrNotFound) || err.Error() != "nvidia-smi not found (no NVIDIA driver on this host)" {
				t.Errorf("%s: err = %v", p, err)
			}
			_, _, err = Probe(ctx, ExecRunner(p))
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("Probe: err = %v", err)
			}
		}
	})
	t.Run("runs with arguments", func(t *testing.T) {
		out, err := ExecRunner(script(t, `echo "$@"`))(ctx, "-q", "-x")
		if err != nil || string(out) != "-q -x\n" {
			t.Errorf("got %q, %v", out, err)
		}
	})
	t.Run("failure names the command and its message", func(t *testing.T) {
		p := script(t, "echo 'Failed to initialize NVML: Driver/library version mismatch'\nexit 9\n")
		_, err := ExecRunner(p)(ctx, "-q", "-x")
		if err == nil || !strings.Contains(err.Error(), "exit status 9") || !strings.Contains(err.Error(), "version mismatch") ||
			!strings.Contains(err.Error(), "-q -x") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := ExecRunner(script(t, "sleep 5\n"))(ctx, "-L"); err == nil {
			t.Error("a canceled run succeeded")
		}
	})
}
