package unit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// gpuHost is a fake host with NVIDIA GPUs: nvidia-smi, nvidia-ctk,
// systemctl, dpkg-query and apt-get as functions over its state, each
// call recorded by the Fake. Their output has the real tools' shapes.
type gpuHost struct {
	*Fake
	mu       sync.Mutex
	gpus     []*fakeGPU
	services map[string]*fakeService
	procs    [][2]string // gpu uuid, pid
	driver   string      // installed package version
	repo     []string    // versions apt can install
	failFM   bool        // nvidia-fabricmanager fails to start
}

type fakeGPU struct {
	uuid, persistence, compute, memClock, grClock string
	power                                         int
	mig                                           bool
	instances                                     []string
}

type fakeService struct{ loaded, active, enabled bool }

const (
	gpu0 = "GPU-5f1c2d4e-0000-4000-8000-000000000000"
	gpu1 = "GPU-5f1c2d4e-0000-4000-8000-000000000001"
)

func newGPUHost() *gpuHost {
	h := &gpuHost{Fake: NewFake(), services: map[string]*fakeService{
		FabricManagerService: {loaded: true}, "containerd.service": {loaded: true, active: true, enabled: true},
	}, driver: "550.54.15-1", repo: []string{"550.54.15-1", "550.90.07-1"}}
	for _, u := range []string{gpu0, gpu1} {
		h.gpus = append(h.gpus, &fakeGPU{uuid: u, persistence: "Disabled", compute: "Default", power: 700, memClock: "2619", grClock: "1980"})
	}
	h.SetFile("/sys/module/nvidia/version", "550.54.15\n")
	h.SetTool("nvidia-smi", h.smi)
	h.SetTool("nvidia-ctk", h.ctk)
	h.SetTool("systemctl", h.systemctl)
	h.SetTool("dpkg-query", func(_ *Fake, args []string) (string, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return "install ok installed|" + h.driver, nil
	})
	h.SetTool("apt-get", func(_ *Fake, args []string) (string, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if args[0] == "update" {
			return "", nil
		}
		_, v, _ := strings.Cut(args[len(args)-1], "=")
		if !slices.Contains(h.repo, v) {
			return "E: Version '" + v + "' for 'nvidia-driver' was not found", errors.New("exit status 100")
		}
		h.driver = v
		return "", nil
	})
	h.SetTool("nvidia-cuda-mps-control", func(*Fake, []string) (string, error) { return "", nil })
	return h
}

func (h *gpuHost) gpu(id string) *fakeGPU {
	for _, g := range h.gpus {
		if strings.EqualFold(g.uuid, id) {
			return g
		}
	}
	return nil
}

func (h *gpuHost) smi(_ *Fake, args []string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	switch {
	case strings.HasPrefix(args[0], "--query-gpu="):
		fields := strings.Split(strings.TrimPrefix(args[0], "--query-gpu="), ",")
		for _, g := range h.gpus {
			var row []string
			for _, f := range fields {
				row = append(row, map[string]string{"uuid": g.uuid, "persistence_mode": g.persistence, "power.limit": fmt.Sprintf("%d.00", g.power),
					"compute_mode": g.compute, "clocks.applications.memory": g.memClock, "clocks.applications.graphics": g.grClock,
					"mig.mode.current": map[bool]string{true: "Enabled", false: "Disabled"}[g.mig], "driver_version": upstream(h.driver)}[f])
			}
			b.WriteString(strings.Join(row, ", ") + "\n")
		}
	case strings.HasPrefix(args[0], "--query-compute-apps="):
		for _, p := range h.procs {
			b.WriteString(p[0] + ", " + p[1] + "\n")
		}
	case args[0] == "-L":
		for i, g := range h.gpus {
			fmt.Fprintf(&b, "GPU %d: NVIDIA H100 80GB HBM3 (UUID: %s)\n", i, g.uuid)
			for j, p := range g.instances {
				fmt.Fprintf(&b, "  MIG %s Device %d: (UUID: MIG-%s-%d)\n", p, j, g.uuid[4:], j)
			}
		}
	case args[0] == "-i" && len(args) == 4:
		g := h.gpu(args[1])
		switch args[2] {
		case "-pm":
			g.persistence = map[string]string{"1": "Enabled", "0": "Disabled"}[args[3]]
		case "-pl":
			fmt.Sscan(args[3], &g.power)
		case "-c":
			g.compute = map[string]string{"0": "Default", "3": "Exclusive_Process", "2": "Prohibited"}[args[3]]
		case "-ac":
			g.memClock, g.grClock, _ = strings.Cut(args[3], ",")
		case "-mig":
			g.mig = args[3] == "1"
		}
	case args[0] == "mig":
		g := h.gpu(args[2])
		switch args[3] {
		case "-lgi":
			if len(g.instances) == 0 {
				return "No GPU instances found: Not Found\n", errors.New("exit status 6")
			}
			b.WriteString("+-------------------------------------------------------+\n| GPU instances:                                        |\n| GPU   Name             Profile  Instance   Placement  |\n|                          ID       ID       Start:Size |\n|=======================================================|\n")
			for i, p := range g.instances {
				fmt.Fprintf(&b, "|   0  MIG %-14s   19       %2d          %d:1     |\n", p, i+1, i)
			}
		case "-dci":
		case "-dgi":
			g.instances = nil
		case "-cgi":
			if !g.mig {
				return "Unable to create a GPU instance: Insufficient Permissions", errors.New("exit status 4")
			}
			g.instances = strings.Split(args[4], ",")
		}
	}
	return b.String(), nil
}

func (h *gpuHost) ctk(f *Fake, args []string) (string, error) {
	h.mu.Lock()
	v := upstream(h.driver)
	h.mu.Unlock()
	switch {
	case args[0] == "cdi" && args[1] == "generate":
		f.SetFile(strings.TrimPrefix(args[2], "--output="), "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n# /usr/lib/x86_64-linux-gnu/libcuda.so."+v+"\n")
	case args[0] == "runtime" && args[1] == "configure":
		f.SetFile(strings.TrimPrefix(args[3], "--config="), "[plugins]\n# nvidia runtime\n")
	}
	return "", nil
}

func (h *gpuHost) systemctl(f *Fake, args []string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	svc := func(name string) *fakeService {
		if s := h.services[name]; s != nil {
			return s
		}
		s := &fakeService{}
		if _, ok := f.File("/etc/systemd/system/" + name); ok {
			s.loaded = true
		}
		h.services[name] = s
		return s
	}
	switch args[0] {
	case "show":
		s := svc(args[2])
		return fmt.Sprintf("LoadState=%s\nActiveState=%s\nUnitFileState=%s\n", map[bool]string{true: "loaded", false: "not-found"}[s.loaded],
			map[bool]string{true: "active", false: "inactive"}[s.active], map[bool]string{true: "enabled", false: "disabled"}[s.enabled]), nil
	case "enable":
		s := svc(args[len(args)-1])
		s.enabled = true
		if args[1] == "--now" {
			if args[2] == FabricManagerService && h.failFM {
				return "Job for nvidia-fabricmanager.service failed", errors.New("exit status 1")
			}
			s.active = true
		}
	case "restart":
		svc(args[1]).active = true
	case "disable":
		s := svc(args[2])
		s.enabled, s.active = false, false
	}
	return "", nil
}

func TestNvidiaUnitsConvergeAndAreIdempotent(t *testing.T) {
	for _, tc := range []struct {
		u     Unit
		body  string
		calls []string // of the first pass, besides the reads
	}{
		{GPUSettings{}, `{"persistence_mode":true,"power_limit_w":500,"compute_mode":"EXCLUSIVE_PROCESS","application_clocks":{"memory_mhz":2619,"graphics_mhz":1410}}`,
			[]string{"nvidia-smi -i " + gpu0 + " -pm 1", "nvidia-smi -i " + gpu0 + " -pl 500", "nvidia-smi -i " + gpu0 + " -c 3", "nvidia-smi -i " + gpu0 + " -ac 2619,1410"}},
		{MIGLayout{}, `{"gpus":[{"gpu":"` + gpu1 + `","profiles":["3g.40gb","1g.10gb","1g.10gb"]}]}`,
			[]string{"nvidia-smi -i " + gpu1 + " -mig 1", "nvidia-smi mig -i " + gpu1 + " -cgi 1g.10gb,1g.10gb,3g.40gb -C"}},
		{FabricManager{}, `{"enabled":true}`, []string{"systemctl enable --now " + FabricManagerService}},
		{GPUSharing{}, `{"mps":[{"name":"a","gpus":["` + gpu0 + `","` + gpu1 + `"]}]}`,
			[]string{"systemctl daemon-reload", "systemctl enable bcd-mps-a.service", "systemctl restart bcd-mps-a.service"}},
		{ContainerToolkit{}, `{"cdi":true,"runtimes":["containerd"]}`,
			[]string{"nvidia-ctk cdi generate --output=" + NvidiaCDIFile, "nvidia-ctk runtime configure --runtime=containerd --config=/etc/containerd/conf.d/99-bcd-nvidia.toml", "systemctl restart containerd.service"}},
		{NvidiaDriver{}, `{"version":"550.54.15-1"}`, nil},
	} {
		t.Run(tc.u.Name(), func(t *testing.T) {
			h := newGPUHost()
			p := converge(t, tc.u, h, tc.body)
			if len(p.Changes) == 0 && tc.calls != nil {
				t.Fatal("nothing planned")
			}
			var changed []string
			for _, c := range h.Calls() {
				if !strings.Contains(c, "--query") && !strings.HasPrefix(c, "systemctl show") && !strings.HasSuffix(c, "-lgi") && c != "nvidia-smi -L" && !strings.HasPrefix(c, "dpkg-query") {
					changed = append(changed, c)
				}
			}
			for _, want := range tc.calls {
				if !slices.Contains(changed, want) {
					t.Errorf("calls %q lack %q", changed, want)
				}
			}
			// A second pass changes nothing (converge checked the plan;
			// here the commands).
			p2, err := tc.u.Plan(context.Background(), h, json.RawMessage(tc.body))
			if err != nil || len(p2.Changes) != 0 || len(p2.Conditions) != 0 {
				t.Fatalf("second plan %v %v %v", p2.Changes, p2.Conditions, err)
			}
		})
	}
}

func TestMIGLayoutRefusesABusyGPU(t *testing.T) {
	body := `{"gpus":[{"gpu":"` + gpu1 + `","profiles":["7g.80gb"]}]}`
	for name, setup := range map[string]func(h *gpuHost){
		"a hold of the GPU": func(h *gpuHost) {
			h.SetFile("/run/bcd-alloc/a1.env", "BCD_ALLOCATION=a1\nNVIDIA_VISIBLE_DEVICES="+gpu1+"\nCUDA_VISIBLE_DEVICES="+gpu1+"\n")
		},
		"a hold of one of its MIG devices": func(h *gpuHost) {
			h.gpus[1].mig, h.gpus[1].instances = true, []string{"1g.10gb"}
			h.SetFile("/run/bcd-alloc/a2.env", "NVIDIA_VISIBLE_DEVICES=MIG-"+gpu1[4:]+"-0\n")
		},
		"a compute process": func(h *gpuHost) { h.procs = [][2]string{{gpu1, "4242"}} },
	} {
		t.Run(name, func(t *testing.T) {
			h := newGPUHost()
			setup(h)
			before := fmt.Sprint(h.gpus[1].mig, h.gpus[1].instances)
			p, err := MIGLayout{}.Plan(context.Background(), h, json.RawMessage(body))
			if err != nil || len(p.Changes) == 0 {
				t.Fatalf("plan %v %v", p.Changes, err)
			}
			h.Calls()
			err = MIGLayout{}.Apply(context.Background(), h, json.RawMessage(body), p)
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("Apply = %v, want ErrRefused", err)
			}
			for _, c := range h.Calls() {
				if strings.Contains(c, "-mig") || strings.Contains(c, "-cgi") || strings.Contains(c, "-dgi") || strings.Contains(c, "-dci") {
					t.Errorf("the busy GPU was touched: %s", c)
				}
			}
			if after := fmt.Sprint(h.gpus[1].mig, h.gpus[1].instances); after != before {
				t.Errorf("GPU changed from %s to %s", before, after)
			}
		})
	}
}

func TestMIGLayoutUnknownGPU(t *testing.T) {
	_, err := MIGLayout{}.Plan(context.Background(), newGPUHost(), json.RawMessage(`{"gpus":[{"gpu":"GPU-00000000-0000-4000-8000-00000000dead","profiles":["1g.10gb"]}]}`))
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("a GPU the host lacks: %v", err)
	}
}

// A driver version change: pinned, installed; the loaded module is the
// old one until the next boot: RebootRequired.
func TestNvidiaDriverVersionChange(t *testing.T) {
	h := newGPUHost()
	p := converge(t, NvidiaDriver{}, h, `{"version":"550.90.07-1"}`)
	if !hasChange(p, "install nvidia-driver 550.90.07-1 (installed: 550.54.15-1)") || !hasChange(p, "write "+NvidiaPinFile) {
		t.Fatalf("plan %v", p.Changes)
	}
	if pin, _ := h.File(NvidiaPinFile); !strings.Contains(pin, "Package: nvidia-driver\nPin: version 550.90.07-1\nPin-Priority: 1001\n") {
		t.Fatalf("pin %q", pin)
	}
	again, _ := NvidiaDriver{}.Plan(context.Background(), h, json.RawMessage(`{"version":"550.90.07-1"}`))
	if conditions(again, RebootRequired) != 1 {
		t.Fatalf("conditions %v, want RebootRequired", again.Conditions)
	}
	h.SetFile("/sys/module/nvidia/version", "550.90.07\n")
	if again, _ = (NvidiaDriver{}).Plan(context.Background(), h, json.RawMessage(`{"version":"550.90.07-1"}`)); len(again.Conditions) != 0 {
		t.Fatalf("after the reboot: %v", again.Conditions)
	}
	// A version the repository lacks fails, the pin written.
	p, _ = NvidiaDriver{}.Plan(context.Background(), h, json.RawMessage(`{"version":"999.1-1"}`))
	if err := (NvidiaDriver{}).Apply(context.Background(), h, json.RawMessage(`{"version":"999.1-1"}`), p); err == nil || !strings.Contains(err.Error(), "was not found") {
		t.Fatalf("Apply of a missing version = %v", err)
	}
}

// A fabric manager that does not start raises FabricManagerDown and fails.
func TestFabricManagerDown(t *testing.T) {
	h := newGPUHost()
	h.failFM = true
	p, err := FabricManager{}.Plan(context.Background(), h, json.RawMessage(`{"enabled":true}`))
	if err != nil || conditions(p, FabricManagerDown) != 1 {
		t.Fatalf("plan %v %v", p.Conditions, err)
	}
	if err := (FabricManager{}).Apply(context.Background(), h, nil, p); err == nil {
		t.Fatal("Apply succeeded with a fabric manager that does not start")
	}
	delete(h.services, FabricManagerService)
	if _, err := (FabricManager{}).Plan(context.Background(), h, json.RawMessage(`{"enabled":true}`)); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("without the service: %v", err)
	}
}

// An MPS daemon that stopped raises MPSDown and is started again.
func TestMPSDown(t *testing.T) {
	h := newGPUHost()
	body := `{"mps":[{"name":"a","gpus":["` + gpu0 + `"]}]}`
	converge(t, GPUSharing{}, h, body)
	h.services["bcd-mps-a.service"].active = false
	p := converge(t, GPUSharing{}, h, body)
	if conditions(p, MPSDown) != 1 {
		t.Fatalf("conditions %v, want MPSDown", p.Conditions)
	}
	// No set left: the service goes.
	converge(t, GPUSharing{}, h, "")
	if _, ok := h.File("/etc/systemd/system/bcd-mps-a.service"); ok {
		t.Fatal("the MPS service file is still there")
	}
}

// Under systemd apt-get runs in a transient service of its own
// (systemd-run), never under the caller's confinement.
func TestNvidiaDriverAptUnderSystemd(t *testing.T) {
	h := newGPUHost()
	h.SetFile("/run/systemd/system/.present", "")
	apt := h.tools["apt-get"]
	h.SetTool("systemd-run", func(f *Fake, args []string) (string, error) {
		i := slices.Index(args, "--")
		if i < 0 || args[i+1] != "apt-get" || !slices.Contains(args, "--unit="+AptUnit) || !slices.Contains(args, "--wait") {
			return "", fmt.Errorf("systemd-run %v", args)
		}
		return apt(f, args[i+2:])
	})
	converge(t, NvidiaDriver{}, h, `{"version":"550.90.07-1"}`)
	var viaRun, direct int
	for _, c := range h.Calls() {
		if strings.HasPrefix(c, "systemd-run ") && strings.Contains(c, " -- apt-get ") {
			viaRun++
		}
		if strings.HasPrefix(c, "apt-get") {
			direct++
		}
	}
	if viaRun != 2 || direct != 0 || h.driver != "550.90.07-1" {
		t.Fatalf("apt-get through systemd-run %d times, directly %d, installed %s; calls %q", viaRun, direct, h.driver, h.Calls())
	}
}
