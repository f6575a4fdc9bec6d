package unit

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
)

// The shared suites: each unit's behaviour written once against a System,
// run on the Fake and, where the machine allows, on the real kernel (files
// under a test directory, /proc and /sys the kernel's own).

// converge plans body, applies it and plans again: the second plan must
// find nothing. It answers the first plan.
func converge(t *testing.T, u Unit, sys System, body string) Plan {
	t.Helper()
	ctx := context.Background()
	var b json.RawMessage
	if body != "" {
		b = json.RawMessage(body)
	}
	if err := u.Check(b); err != nil {
		t.Fatalf("%s: Check(%s) = %v", u.Name(), body, err)
	}
	p, err := u.Plan(ctx, sys, b)
	if err != nil {
		t.Fatalf("%s: Plan = %v", u.Name(), err)
	}
	if len(p.Changes) > 0 {
		if err := u.Apply(ctx, sys, b, p); err != nil {
			t.Fatalf("%s: Apply(%v) = %v", u.Name(), p.Changes, err)
		}
	}
	again, err := u.Plan(ctx, sys, b)
	if err != nil || len(again.Changes) != 0 {
		t.Fatalf("%s: Plan after Apply = %v, %v; want nothing (idempotent)", u.Name(), again.Changes, err)
	}
	return p
}

func read(t *testing.T, sys System, name string) string {
	t.Helper()
	b, err := sys.ReadFile(name)
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return string(b)
}

func hasChange(p Plan, prefix string) bool {
	return slices.ContainsFunc(p.Changes, func(c string) bool { return strings.HasPrefix(c, prefix) })
}

// sysctlSuite: kernel.msgmax (a sysctl of the IPC namespace, so the real
// run changes only its own namespace's).
func sysctlSuite(t *testing.T, sys System) {
	u := Sysctl{}
	p := converge(t, u, sys, `{"settings":{"kernel.msgmax":"16384"}}`)
	if !hasChange(p, "write "+SysctlFile) || !hasChange(p, "set kernel.msgmax = 16384") {
		t.Fatalf("first plan %v", p.Changes)
	}
	if v := strings.TrimSpace(read(t, sys, "/proc/sys/kernel/msgmax")); v != "16384" {
		t.Fatalf("kernel.msgmax = %s after Apply, want 16384", v)
	}
	if f := read(t, sys, SysctlFile); !strings.Contains(f, "\nkernel.msgmax = 16384\n") {
		t.Fatalf("%s = %q", SysctlFile, f)
	}
	// A hand edit of the file and of the kernel's value are put back.
	if err := sys.WriteFile(SysctlFile, []byte("kernel.msgmax = 1\n")); err != nil {
		t.Fatal(err)
	}
	if err := sys.WriteKernel("/proc/sys/kernel/msgmax", "9000"); err != nil {
		t.Fatal(err)
	}
	p = converge(t, u, sys, `{"settings":{"kernel.msgmax":"16384"}}`)
	if !hasChange(p, "write "+SysctlFile) || !hasChange(p, "set kernel.msgmax") {
		t.Fatalf("drift plan %v", p.Changes)
	}
	// Nothing desired: the file goes; the kernel keeps its value until boot.
	p = converge(t, u, sys, "")
	if !hasChange(p, "remove "+SysctlFile) {
		t.Fatalf("removal plan %v", p.Changes)
	}
	if _, err := sys.ReadFile(SysctlFile); !isNotExist(err) {
		t.Fatalf("%s after removal: %v", SysctlFile, err)
	}
}

func TestSysctlFake(t *testing.T) {
	f := NewFake()
	f.SetFile("/proc/sys/kernel/msgmax", "8192\n")
	sysctlSuite(t, f)
}

// TestSysctlReal runs the suite on the real kernel in a new IPC namespace
// (the test binary again, under unshare --ipc).
func TestSysctlReal(t *testing.T) {
	if os.Getenv("BCD_HOST_UNIT_IN_NS") == "1" {
		sysctlSuite(t, Real{Root: t.TempDir()})
		return
	}
	testenv.NeedRoot(t, "a new IPC namespace and its sysctls")
	unshare := testenv.NeedTool(t, "unshare", "util-linux")
	cmd := exec.Command(unshare, "--ipc", os.Args[0], "-test.run=^TestSysctlReal$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "BCD_HOST_UNIT_IN_NS=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestSysctlReal") {
		t.Fatalf("the suite in a new IPC namespace: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile("/proc/sys/kernel/msgmax"); strings.TrimSpace(string(b)) == "16384" {
		t.Fatal("the host's kernel.msgmax changed: the suite ran outside its namespace")
	}
}

func TestSysctlRefuses(t *testing.T) {
	for _, body := range []string{
		`{"settings":{"../../etc/x":"1"}}`,
		`{"settings":{"kernel.msgmax":"1\nkernel.x = 2"}}`,
		`{"settings":{"vm.nr_hugepages":"4"}}`,
		`{"settings":{"kernel.msgmax":""}}`,
		`{"settings":{}, "other": 1}`,
		`{"settings":{"kernel":"1"}}`,
	} {
		if err := (Sysctl{}).Check(json.RawMessage(body)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Check(%s) = %v, want ErrInvalid", body, err)
		}
	}
}

// hugepagesSuite: the 2 MiB pool at run time and its sysctl.d file.
func hugepagesSuite(t *testing.T, sys System, pages string) {
	u := Hugepages{}
	p := converge(t, u, sys, `{"pages_2m":`+pages+`}`)
	if !hasChange(p, "set the 2 MiB pool to "+pages) {
		t.Fatalf("first plan %v", p.Changes)
	}
	if v := strings.TrimSpace(read(t, sys, Pool2M)); v != pages {
		t.Fatalf("pool = %s, want %s", v, pages)
	}
	if f := read(t, sys, HugepagesFile); !strings.Contains(f, "\nvm.nr_hugepages = "+pages+"\n") {
		t.Fatalf("%s = %q", HugepagesFile, f)
	}
	if len(p.Conditions) != 0 {
		t.Fatalf("2 MiB pages raised %v; they need no reboot", p.Conditions)
	}
	converge(t, u, sys, `{"pages_2m":0}`)
	if v := strings.TrimSpace(read(t, sys, Pool2M)); v != "0" {
		t.Fatalf("pool = %s, want 0", v)
	}
}

func TestHugepagesFake(t *testing.T) {
	f := NewFake()
	f.SetFile(Pool2M, "0\n")
	hugepagesSuite(t, f, "64")
}

// TestHugepagesReal sets the real 2 MiB pool to 2 pages (4 MiB) and back.
func TestHugepagesReal(t *testing.T) {
	testenv.NeedRoot(t, "the kernel's huge page pool")
	before, err := os.ReadFile(Pool2M)
	if err != nil {
		testenv.Skip(t, "this kernel has no 2 MiB huge pages (%v)", err)
	}
	if strings.TrimSpace(string(before)) != "0" {
		testenv.Skip(t, "the host's 2 MiB pool is in use (%s pages); the test sets it from 0", strings.TrimSpace(string(before)))
	}
	t.Cleanup(func() { _ = os.WriteFile(Pool2M, before, 0) })
	hugepagesSuite(t, Real{Root: t.TempDir()}, "2")
}

// grubFake gives f GRUB: update-grub renders /boot/grub/grub.cfg's linux
// line from the drop-ins, as grub-mkconfig does from GRUB_CMDLINE_LINUX.
func grubFake(f *Fake) {
	f.SetFile("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda ro quiet\n")
	f.SetTool("update-grub", func(f *Fake, _ []string) (string, error) {
		args := []string{"root=/dev/vda", "ro"}
		for _, d := range f.Glob("/etc/default/grub.d/*.cfg") {
			c, _ := f.File(d)
			for _, l := range strings.Split(c, "\n") {
				if v, ok := strings.CutPrefix(l, `GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX `); ok {
					args = append(args, strings.TrimSuffix(v, `"`))
				}
			}
		}
		f.SetFile(GrubConfig, "linux /vmlinuz "+strings.Join(args, " ")+"\n")
		return "Generating grub configuration file ...\ndone\n", nil
	})
}

// reboot makes the fake's running command line the one GRUB renders.
func reboot(f *Fake) {
	c, _ := f.File(GrubConfig)
	f.SetFile("/proc/cmdline", "BOOT_IMAGE="+strings.TrimPrefix(strings.TrimSpace(c), "linux "))
}

func conditions(p Plan, typ string) int {
	n := 0
	for _, c := range p.Conditions {
		if c.Type == typ {
			n++
		}
	}
	return n
}

func TestCommandLineUnits(t *testing.T) {
	for _, tc := range []struct {
		u    Unit
		body string
		args string
	}{
		{IOMMU{}, `{"vendor":"intel","passthrough":true}`, "intel_iommu=on iommu=pt"},
		{CPU{}, `{"isolate":"2-3"}`, "isolcpus=2-3 nohz_full=2-3 rcu_nocbs=2-3"},
		{Hugepages{}, `{"pages_1g":4}`, "hugepagesz=1G hugepages=4"},
	} {
		t.Run(tc.u.Name(), func(t *testing.T) {
			f := NewFake()
			grubFake(f)
			p := converge(t, tc.u, f, tc.body)
			if !hasChange(p, "write "+GrubDropIn(tc.u.Name())) {
				t.Fatalf("plan %v", p.Changes)
			}
			if c := f.Calls(); !slices.Equal(c, []string{"update-grub"}) {
				t.Fatalf("calls %v, want update-grub once", c)
			}
			cfg, _ := f.File(GrubConfig)
			if !strings.Contains(cfg, tc.args) {
				t.Fatalf("grub.cfg %q lacks %s", cfg, tc.args)
			}
			again, _ := tc.u.Plan(context.Background(), f, json.RawMessage(tc.body))
			if conditions(again, RebootRequired) != 1 {
				t.Fatalf("conditions before the reboot %v, want RebootRequired", again.Conditions)
			}
			reboot(f)
			again, _ = tc.u.Plan(context.Background(), f, json.RawMessage(tc.body))
			if len(again.Conditions) != 0 || len(again.Changes) != 0 {
				t.Fatalf("after the reboot: %v %v, want nothing", again.Changes, again.Conditions)
			}
			// Nothing asked: the drop-in goes and GRUB renders again.
			p = converge(t, tc.u, f, "null")
			if !hasChange(p, "remove "+GrubDropIn(tc.u.Name())) {
				t.Fatalf("removal plan %v", p.Changes)
			}
			if cfg, _ := f.File(GrubConfig); strings.Contains(cfg, tc.args) {
				t.Fatalf("grub.cfg %q still has %s", cfg, tc.args)
			}
		})
	}
}

func TestCommandLineWithoutGrub(t *testing.T) {
	f := NewFake()
	f.SetFile("/proc/cmdline", "root=/dev/vda\n")
	_, err := IOMMU{}.Plan(context.Background(), f, json.RawMessage(`{"passthrough":true}`))
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "no boot loader") {
		t.Fatalf("Plan without GRUB = %v, want ErrUnsupported naming the boot loader", err)
	}
	if _, ok := f.File(GrubDropIn("iommu")); ok {
		t.Fatal("a drop-in was written")
	}
}

// modprobeFake loads a module as modprobe would: /sys/module/<name> with
// its parameters.
func modprobeFake(f *Fake) {
	f.SetTool("modprobe", func(f *Fake, args []string) (string, error) {
		if len(args) < 2 || args[0] != "--" {
			return "", errors.New("usage")
		}
		name := args[1]
		f.SetFile("/sys/module/"+name+"/initstate", "live\n")
		for _, a := range args[2:] {
			k, v, _ := strings.Cut(a, "=")
			f.SetFile("/sys/module/"+name+"/parameters/"+k, v+"\n")
		}
		return "", nil
	})
}

func kernelModulesSuite(t *testing.T, sys System, calls func() []string) {
	u := KernelModules{}
	body := `{"modules":[{"name":"dummy","options":{"numdummies":"2"}}]}`
	p := converge(t, u, sys, body)
	if !hasChange(p, "modprobe dummy") || !hasChange(p, "write "+ModulesLoadFile) || !hasChange(p, "write "+ModprobeFile) {
		t.Fatalf("plan %v", p.Changes)
	}
	if c := calls(); c != nil && !slices.Equal(c, []string{"modprobe -- dummy numdummies=2"}) {
		t.Fatalf("calls %v", c)
	}
	if f := read(t, sys, ModprobeFile); !strings.Contains(f, "\noptions dummy numdummies=2\n") {
		t.Fatalf("%s = %q", ModprobeFile, f)
	}
	if f := read(t, sys, ModulesLoadFile); !strings.HasSuffix(f, "\ndummy\n") {
		t.Fatalf("%s = %q", ModulesLoadFile, f)
	}
	p = converge(t, u, sys, "")
	if !hasChange(p, "remove "+ModulesLoadFile) || !hasChange(p, "remove "+ModprobeFile) {
		t.Fatalf("removal plan %v", p.Changes)
	}
}

func TestKernelModulesFake(t *testing.T) {
	f := NewFake()
	modprobeFake(f)
	kernelModulesSuite(t, f, f.Calls)
	// Loaded with another option: taken at the next load, RebootRequired.
	p, err := KernelModules{}.Plan(context.Background(), f, json.RawMessage(`{"modules":[{"name":"dummy","options":{"numdummies":"3"}}]}`))
	if err != nil || conditions(p, RebootRequired) != 1 || hasChange(p, "modprobe") {
		t.Fatalf("plan %v %v %v, want RebootRequired and no modprobe", p.Changes, p.Conditions, err)
	}
}

// TestKernelModulesReal loads dummy into the real kernel.
func TestKernelModulesReal(t *testing.T) {
	testenv.NeedRoot(t, "modprobe")
	testenv.NeedTool(t, "modprobe", "kmod")
	if _, err := os.Stat("/proc/modules"); err != nil {
		testenv.NotApplicable(t, "this kernel loads no modules (no /proc/modules); the systemd tier loads dummy in its guest")
	}
	if _, err := os.Stat("/sys/module/dummy"); err == nil {
		testenv.Skip(t, "dummy is loaded already")
	}
	t.Cleanup(func() { _ = exec.Command("modprobe", "-r", "dummy").Run() })
	kernelModulesSuite(t, Real{Root: t.TempDir()}, func() []string { return nil })
}

func TestKernelModulesRefuses(t *testing.T) {
	for _, body := range []string{
		`{"modules":[{"name":"../x"}]}`,
		`{"modules":[{"name":"dummy","options":{"a b":"1"}}]}`,
		`{"modules":[{"name":"dummy","options":{"numdummies":"1\ninstall x /bin/sh"}}]}`,
		`{"modules":[{"name":"dummy"},{"name":"dummy"}]}`,
		`{"modules":[{"name":"-r"}],"x":1}`,
	} {
		if err := (KernelModules{}).Check(json.RawMessage(body)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Check(%s) = %v, want ErrInvalid", body, err)
		}
	}
}

func TestCPUGovernor(t *testing.T) {
	f := NewFake()
	for _, c := range []string{"0", "1"} {
		f.SetFile("/sys/devices/system/cpu/cpu"+c+"/cpufreq/scaling_governor", "schedutil\n")
	}
	p := converge(t, CPU{}, f, `{"governor":"performance"}`)
	if !hasChange(p, "set the governor of 2 CPUs to performance") {
		t.Fatalf("plan %v", p.Changes)
	}
	// No cpufreq: the unit says so.
	_, err := CPU{}.Plan(context.Background(), NewFake(), json.RawMessage(`{"governor":"performance"}`))
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Plan without cpufreq = %v", err)
	}
}

func TestK8sJoinUnsupported(t *testing.T) {
	_, err := K8sJoin{}.Plan(context.Background(), NewFake(), json.RawMessage(`{"token":"x"}`))
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("k8s-join = %v, want ErrUnsupported", err)
	}
}

func TestRegistryOrder(t *testing.T) {
	r, err := NewRegistry(IOMMU{}, Sysctl{}, KernelModules{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range r.Units() {
		names = append(names, u.Name())
	}
	if !slices.Equal(names, []string{"kernel-modules", "sysctl", "iommu"}) {
		t.Fatalf("order %v", names)
	}
	if _, err := NewRegistry(Sysctl{}, Sysctl{}); err == nil {
		t.Fatal("a unit given twice was taken")
	}
	if _, err := r.DecodeSection(json.RawMessage(`{"gpus":{}}`)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an unknown unit: %v", err)
	}
}

func TestReadWanted(t *testing.T) {
	f := NewFake()
	grubFake(f)
	f.SetFile(Pool2M, "0\n")
	converge(t, IOMMU{}, f, `{"passthrough":true}`)
	converge(t, Hugepages{}, f, `{"pages_2m":16}`)
	w := ReadWanted(f)
	if w.Pages2M == nil || *w.Pages2M != 16 || !slices.Equal(w.Args["iommu"], []string{"iommu=pt"}) || !slices.Equal(w.Pending["iommu"], []string{"iommu=pt"}) {
		t.Fatalf("wanted %+v", w)
	}
	reboot(f)
	if w := ReadWanted(f); len(w.Pending) != 0 {
		t.Fatalf("pending after the reboot: %v", w.Pending)
	}
}

// Under systemd the modules load through systemd-modules-load, which reads
// the unit's two files.
func TestKernelModulesUnderSystemd(t *testing.T) {
	f := NewFake()
	f.SetFile("/run/systemd/system/.exists", "")
	f.SetTool("systemctl", func(f *Fake, args []string) (string, error) {
		if strings.Join(args, " ") != "restart systemd-modules-load.service" {
			return "", errors.New("unexpected")
		}
		load, _ := f.File(ModulesLoadFile)
		opts, _ := f.File(ModprobeFile)
		for _, l := range strings.Split(load, "\n") {
			if l == "" || strings.HasPrefix(l, "#") {
				continue
			}
			f.SetFile("/sys/module/"+l+"/initstate", "live\n")
			for _, o := range strings.Split(opts, "\n") {
				if rest, ok := strings.CutPrefix(o, "options "+l+" "); ok {
					for _, kv := range strings.Fields(rest) {
						k, v, _ := strings.Cut(kv, "=")
						f.SetFile("/sys/module/"+l+"/parameters/"+k, v+"\n")
					}
				}
			}
		}
		return "", nil
	})
	kernelModulesSuite(t, f, func() []string {
		c := f.Calls()
		if !slices.Equal(c, []string{"systemctl restart systemd-modules-load.service"}) {
			t.Fatalf("calls %v", c)
		}
		return nil
	})
}
