package doctor

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/pki"
)

func fixed(name string, st Status, detail string) Check {
	return Check{Name: name, Run: func(context.Context) Result { return Result{Status: st, Detail: detail} }}
}

func TestFormat(t *testing.T) {
	tests := []struct {
		r    Result
		want string
	}{
		{Result{"config", OK, "/etc/bcd/config.toml: gateway https://gw.eu-1.example.com, site fsn1"}, "ok    config    /etc/bcd/config.toml: gateway https://gw.eu-1.example.com, site fsn1\n"},
		{Result{"nvml", Warn, "nvidia-smi not found (no NVIDIA driver on this host)"}, "warn  nvml      nvidia-smi not found (no NVIDIA driver on this host)\n"},
		{Result{"gateway", Fail, "gw:443: TCP connect failed"}, "fail  gateway   gw:443: TCP connect failed\n"},
		{Result{"hugepages", OK, "2 MiB: 512 free of 1024"}, "ok    hugepages 2 MiB: 512 free of 1024\n"},
		{Result{"gpu-isolation", Fail, "x"}, "fail  gpu-isolation x\n"},
		{Result{"kvm", OK, ""}, "ok    kvm\n"},
	}
	for _, tt := range tests {
		if got := Format(tt.r); got != tt.want {
			t.Errorf("Format(%+v)\n got %q\nwant %q", tt.r, got, tt.want)
		}
	}
}

func TestRun(t *testing.T) {
	tests := []struct {
		name   string
		checks []Check
		want   string
		failed bool
	}{
		{
			name: "ok and warn",
			checks: []Check{
				fixed("config", OK, "/etc/bcd/config.toml: gateway https://gw, site s"),
				fixed("kvm", Warn, "/dev/kvm missing"),
			},
			want:   "ok    config    /etc/bcd/config.toml: gateway https://gw, site s\nwarn  kvm       /dev/kvm missing\n",
			failed: false,
		},
		{
			name: "a failure",
			checks: []Check{
				fixed("identity", OK, "node n"),
				fixed("gateway", Fail, "gw:443: TCP connect failed"),
				fixed("clock", OK, "synchronized"),
			},
			want:   "ok    identity  node n\nfail  gateway   gw:443: TCP connect failed\nok    clock     synchronized\n",
			failed: true,
		},
		{
			name:   "a detail on several lines stays on one",
			checks: []Check{fixed("nvml", Fail, "nvidia-smi = exit status 9:\nNVIDIA-SMI has failed\r\n")},
			want:   "fail  nvml      nvidia-smi = exit status 9: NVIDIA-SMI has failed\n",
			failed: true,
		},
		{
			name:   "nothing to run",
			checks: []Check{{Name: "broken"}},
			want:   "fail  broken    check has nothing to run\n",
			failed: true,
		},
		{
			name:   "an unknown status fails",
			checks: []Check{fixed("odd", "maybe", "hm")},
			want:   "fail  odd       check returned status \"maybe\": hm\n",
			failed: true,
		},
		{name: "no checks", checks: nil, want: "", failed: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			failed := Run(context.Background(), tt.checks, &b)
			if b.String() != tt.want {
				t.Errorf("output\n%s\nwant\n%s", b.String(), tt.want)
			}
			if failed != tt.failed {
				t.Errorf("failed = %v, want %v", failed, tt.failed)
			}
			results := Collect(context.Background(), tt.checks)
			var again strings.Builder
			for _, r := range results {
				again.WriteString(Format(r))
			}
			if again.String() != tt.want {
				t.Errorf("Collect disagrees with Run:\n%s", again.String())
			}
		})
	}
}

func testEnv() (*cli.Env, *bytes.Buffer, *bytes.Buffer) {
	var stdout, stderr bytes.Buffer
	return &cli.Env{
		Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
		Getenv: func(string) string { return "" }, Unsetenv: func(string) error { return nil },
	}, &stdout, &stderr
}

func TestCommand(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(good, []byte("gateway = \"https://gw.example.com\"\n[site]\nname = \"fsn1\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.toml")

	tests := []struct {
		name    string
		args    []string
		checks  []Check
		code    int
		stdout  string
		json    []Result
		wantCfg bool // the checks func got a loaded configuration
	}{
		{
			name:    "all ok",
			args:    []string{"--config", good},
			checks:  []Check{fixed("kvm", OK, "/dev/kvm present")},
			code:    0,
			stdout:  "ok    kvm       /dev/kvm present\n",
			wantCfg: true,
		},
		{
			name:    "a warning exits 0",
			args:    []string{"--config", good},
			checks:  []Check{fixed("kvm", Warn, "/dev/kvm missing")},
			code:    0,
			stdout:  "warn  kvm       /dev/kvm missing\n",
			wantCfg: true,
		},
		{
			name:   "a failure exits 1",
			args:   []string{"--config", missing},
			checks: []Check{fixed("config", Fail, "no file"), fixed("kvm", OK, "/dev/kvm present")},
			code:   1,
			stdout: "fail  config    no file\nok    kvm       /dev/kvm present\n",
		},
		{
			name:    "json",
			args:    []string{"--config", good, "--json"},
			checks:  []Check{fixed("kvm", OK, "/dev/kvm present"), fixed("gateway", Fail, "down")},
			code:    1,
			json:    []Result{{"kvm", OK, "/dev/kvm present"}, {"gateway", Fail, "down"}},
			wantCfg: true,
		},
		{
			name:    "json without checks is an empty array",
			args:    []string{"--config", good, "--json"},
			code:    0,
			json:    []Result{},
			wantCfg: true,
		},
		{name: "positional", args: []string{"extra"}, code: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var gotCfg *config.Config
			var gotPath string
			cmd := Command(func(cfg *config.Config, path string) []Check {
				gotCfg, gotPath = cfg, path
				return tt.checks
			})
			env, stdout, stderr := testEnv()
			code := cmd.Run(context.Background(), env, tt.args)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			if tt.code == 2 {
				return
			}
			if tt.json != nil {
				var got []Result
				if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
					t.Fatalf("not JSON: %v\n%s", err, stdout)
				}
				if !reflect.DeepEqual(got, tt.json) {
					t.Errorf("JSON %+v, want %+v", got, tt.json)
				}
			} else if stdout.String() != tt.stdout {
				t.Errorf("stdout\n%s\nwant\n%s", stdout, tt.stdout)
			}
			if (gotCfg != nil) != tt.wantCfg {
				t.Errorf("checks got cfg %v, want loaded=%v", gotCfg, tt.wantCfg)
			}
			if gotPath != tt.args[1] {
				t.Errorf("checks got path %q, want %q", gotPath, tt.args[1])
			}
		})
	}
}

func TestBase(t *testing.T) {
	names := func(cs []Check) string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Name)
		}
		return strings.Join(n, " ")
	}
	if got, want := names(Base(nil, "/x")), "config kvm iommu nft clock cgroups hugepages vfio"; got != want {
		t.Errorf("without a config: %s, want %s", got, want)
	}
	cfg := &config.Config{Gateway: "https://gw.example.com", DataDir: t.TempDir()}
	if got, want := names(Base(cfg, "/x")), "config kvm iommu nft gateway identity node key intent clock cgroups hugepages vfio"; got != want {
		t.Errorf("with a config: %s, want %s", got, want)
	}
}

// TestRealHost runs the checks that read this machine: whatever it has,
// each gives a valid status and a detail.
func TestRealHost(t *testing.T) {
	for _, c := range []Check{KVM(), IOMMU(), Nft(), Clock(), Cgroups(), HugePages(), VFIO()} {
		r := runOne(context.Background(), c)[0]
		if r.Name != c.Name || r.Detail == "" || (r.Status != OK && r.Status != Warn && r.Status != Fail) {
			t.Errorf("%s: %+v", c.Name, r)
		}
		t.Logf("%s", strings.TrimSpace(Format(r)))
	}
}

func TestSignedIntentCheck(t *testing.T) {
	join, _ := pki.GenerateKey()
	root, _ := pki.GenerateKey()
	pin, _ := pki.Pin(join.Public())
	dir := t.TempDir()
	if r := SignedIntent(dir, pin).Run(context.Background()); r.Status != Warn || !strings.Contains(r.Detail, "signed intent is off") {
		t.Errorf("no bundle: %+v", r)
	}
	h, _ := bundle.Load(dir, pin)
	der, _ := x509.MarshalPKIXPublicKey(root.Public())
	tb, _ := bundle.Sign(join, bundle.Document{Version: 1, CommandSigningRoots: [][]byte{der}})
	if _, err := h.Offer(tb); err != nil {
		t.Fatal(err)
	}
	if r := SignedIntent(dir, pin).Run(context.Background()); r.Status != OK {
		t.Errorf("enforced: %+v", r)
	}
	other, _ := pki.GenerateKey()
	otherPin, _ := pki.Pin(other.Public())
	if r := SignedIntent(dir, otherPin).Run(context.Background()); r.Status != Fail {
		t.Errorf("a bundle that does not verify: %+v", r)
	}
}

// TestGPULines: one gpu line per GPU in the documented shape, its status
// the verdict with the problems after it; none without GPUs.
func TestGPULines(t *testing.T) {
	list := func(context.Context) []GPU {
		return []GPU{
			{UUID: "GPU-5f1caaaa-0000", Name: "NVIDIA H100 80GB HBM3", BusyPct: 87, TemperatureC: 61, PowerW: 540, PowerLimitW: 700,
				MemoryUsedMiB: 72909, MemoryTotalMiB: 81559, Status: OK},
			{UUID: "GPU-9a02aaaa-0000", Name: "NVIDIA H100 80GB HBM3", TemperatureC: 34, PowerW: 72, PowerLimitW: 700,
				MemoryTotalMiB: 81559, Status: Warn, Problems: []string{"a row remap waits for a GPU reset (reset the GPU when idle)"}},
			{UUID: "GPU-77", Name: "Tesla T4", Status: Fail, Problems: []string{"NVLinks 3, 5 inactive", "Xid 79"}},
		}
	}
	var b strings.Builder
	failed := Run(context.Background(), []Check{GPUs(list)}, &b)
	want := "ok    gpu       GPU-5f1c… NVIDIA H100 80GB HBM3: 87% busy, 61 C, 540/700 W, 71.2/79.6 GiB\n" +
		"warn  gpu       GPU-9a02… NVIDIA H100 80GB HBM3: 0% busy, 34 C, 72/700 W, 0.0/79.6 GiB; a row remap waits for a GPU reset (reset the GPU when idle)\n" +
		"fail  gpu       GPU-77 Tesla T4: 0% busy, 0 C, 0/0 W, 0.0/0.0 GiB; NVLinks 3, 5 inactive; Xid 79\n"
	if b.String() != want || !failed {
		t.Errorf("got (failed %v)\n%s\nwant\n%s", failed, b.String(), want)
	}
	if rs := Collect(context.Background(), []Check{GPUs(func(context.Context) []GPU { return nil })}); len(rs) != 0 {
		t.Errorf("no GPUs: %+v", rs)
	}
}
