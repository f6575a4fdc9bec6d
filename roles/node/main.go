// Command bcd-node is the node role: the agent on every server of the
// fleet. Its components are wired here, explicitly; the machine it runs
// on is the real one (machine_host.go) or, in a fakehw build, a fake one
// (machine_fakehw.go).
package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/components/agent"
	"github.com/better-compute/bcd/components/agent/agentcmd"
	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/report"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/agent/telemetry"
	"github.com/better-compute/bcd/components/agent/tunnel"
	"github.com/better-compute/bcd/components/agent/update"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/roles"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	hostsection "github.com/better-compute/bcd/components/host/section"
	"github.com/better-compute/bcd/components/host/unit"
	"github.com/better-compute/bcd/components/machine/access"
	"github.com/better-compute/bcd/components/machine/dcgm"
	"github.com/better-compute/bcd/components/machine/devices"
	"github.com/better-compute/bcd/components/machine/doctor"
	"github.com/better-compute/bcd/components/machine/health"
	"github.com/better-compute/bcd/components/machine/nodekinds"
	"github.com/better-compute/bcd/components/machine/nodemetrics"
	"github.com/better-compute/bcd/components/machine/pressure"
	"github.com/better-compute/bcd/components/vm/imds"
	"github.com/better-compute/bcd/components/vm/instances"
	"github.com/better-compute/bcd/components/vm/netguard"
	"github.com/better-compute/bcd/components/vm/snapshot"
	"github.com/better-compute/bcd/components/vm/vmruntime"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// machine wires the node kinds, the status GPU lines, the desired-state
// sections and the health monitor (Xid conditions, pressure, inventory)
// for this machine.
func machine(cfg *config.Config, log *slog.Logger) (agentcmd.Machine, error) {
	hw, _ := hardware(cfg.DataDir)
	var helper *helperclient.Client
	if cfg.Helper.Socket != "" {
		// Unprivileged: run as [helper] user, privileged work through bcd helper.
		if err := helperclient.CheckNodeUser(cfg.Helper.User); err != nil {
			return agentcmd.Machine{}, err
		}
		helper = &helperclient.Client{Socket: cfg.Helper.Socket}
		hw = nodekinds.WithHelper(hw, helper)
	}
	mon := health.New(health.Config{HW: hw, Pressure: pressure.New("/proc"), Log: log})
	vms := &passthrough{}
	dev := devicesSection(hw, mon, holdFiles(cfg.DataDir, helper), holdSlices(cfg.DataDir, helper), vms.InVM)
	acc := access.New(accessConfig(cfg.DataDir, helper, cfg.Access.SystemAccounts))
	sections := []converge.Section{dev, acc}
	host := hostSection(cfg, helper)
	if host != nil {
		sections = []converge.Section{host, dev, acc}
	}
	// The instances' network policy goes through bcd helper; without it
	// an instance with a NIC does not run.
	var guard *netguard.Guard
	if helper != nil {
		guard = netguard.New(helper, log)
	}
	extra, drivers, targets := extraSections(cfg, hw, dev, vms, helper, guard)
	m := agentcmd.Machine{
		Kinds: append(append(nodekinds.Kinds(hw, heldGPU(dev)), nodekinds.LogsCollect(cfg.Path, cfg.DataDir, uploadClient()), dcgm.Kind(""),
			snapshot.NewKind(snapshot.Config{DataDir: cfg.DataDir, Runtime: vms.rt, Client: uploadClient(), Progress: session.ReportProgress, Busy: &vms.busy})),
			extraKinds(cfg.DataDir)...),
		StatusGPUs:   statusGPUs(hw, dev),
		Reboot:       hostReboot(helper),
		Sections:     append(sections, extra...),
		Drivers:      func() []*bcdv1.Driver { return drivers },
		Capabilities: func() []string { return capabilities(cfg, drivers, targets != nil) },
		Tunnels: agent.Tunnels{JWKS: acc.JWKS, SSHPort: cfg.Access.SSHPort,
			Console:   tunnel.Console(tunnel.ConsoleConfig{RootConsole: cfg.Access.RootConsole}),
			Instances: targets},
	}
	withReport(&m)
	withHealth(&m, mon)
	if host != nil {
		withHostConditions(&m, host)
	}
	if guard != nil {
		withNetwork(&m, guard)
		if err := withMetadata(&m, cfg.IMDS.Listen, guard, log); err != nil {
			return agentcmd.Machine{}, err
		}
	}
	withTelemetry(&m, hw, mon, dev, extra)
	withUpdate(&m, cfg, log)
	return m, nil
}

// withReport gives the section that publishes the node's role report
// (instances: the domains the runtime lists) the reporter's setter.
func withReport(m *agentcmd.Machine) {
	for _, s := range m.Sections {
		if p, ok := s.(interface{ SetPublish(func([]byte)) }); ok {
			m.ReportSections = p.SetPublish
		}
		if p, ok := s.(interface {
			Status() ([]status.Instance, bool)
		}); ok {
			m.StatusInstances = p.Status
		}
	}
}

// withHealth adds the health monitor to m: its conditions, pressure and
// inventory in the reports, and its watcher beside the agent.
func withHealth(m *agentcmd.Machine, mon *health.Monitor) {
	m.Report = report.Machine{Conditions: mon.Conditions, Pressure: mon.Pressure, Inventory: mon.Inventory}
	m.Watch = mon.Run
}

// withNetwork gives bcd status the instances' taps and runs the
// 5-second check of bcd's nftables tables beside the agent.
func withNetwork(m *agentcmd.Machine, guard *netguard.Guard) {
	m.StatusTaps = guard.Taps
	watch := m.Watch
	m.Watch = func(ctx context.Context, changed func()) error {
		go guard.Run(ctx, netguard.Interval)
		return watch(ctx, changed)
	}
}

// withMetadata serves the instances' metadata service on [imds] listen
// beside the agent: addresses trusted by the network guard, identity
// tokens from the gateway through the session. On an EC2 host it refuses
// AWS's own metadata addresses, and bcd node does not start. Until the
// address can be bound (the bridge not up yet) it tries again every 5
// seconds.
func withMetadata(m *agentcmd.Machine, listen string, guard *netguard.Guard, log *slog.Logger) error {
	if listen == "" {
		return nil
	}
	ec2 := netpolicy.IsEC2("/sys")
	if err := imds.CheckListen(listen, ec2); err != nil {
		return err
	}
	var get atomic.Pointer[func(ctx context.Context, instance, audience string) (string, error)]
	m.InstanceTokens = func(f func(ctx context.Context, instance, audience string) (string, error)) { get.Store(&f) }
	srv := imds.New(guard, func(ctx context.Context, instance, audience string) (string, error) {
		f := get.Load()
		if f == nil {
			return "", errors.New("no session with the gateway yet")
		}
		return (*f)(ctx, instance, audience)
	}, log)
	m.Beside = func(ctx context.Context) error {
		for {
			l, err := imds.Listen(ctx, listen, ec2)
			if err == nil {
				log.Info("imds: serving the instances' metadata service", "listen", listen)
				return srv.Serve(ctx, l)
			}
			log.Warn("imds: cannot listen yet; trying again in 5 s", "listen", listen, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(5 * time.Second):
			}
		}
	}
	return nil
}

// withHostConditions adds the host units' conditions (RebootRequired,
// FabricManagerDown, MPSDown) to the health monitor's in the reports.
func withHostConditions(m *agentcmd.Machine, host *hostsection.Section) {
	m.StatusHost = func() []status.HostUnit {
		var out []status.HostUnit
		for _, u := range host.Units() {
			out = append(out, status.HostUnit(u))
		}
		return out
	}
	health := m.Report.Conditions
	m.Report.Conditions = func() []*bcdv1.Condition {
		return append(health(), host.Conditions()...)
	}
}

// withTelemetry gives m the telemetry section with the node's GPU and
// host metrics, and the instances' when the build runs them (extra holds
// the instances section then).
func withTelemetry(m *agentcmd.Machine, hw nodekinds.Hardware, mon *health.Monitor, dev *devices.Section, extra []converge.Section) {
	c := nodemetrics.Config{SMI: hw.SMI(), Monitor: mon, HeldBy: dev.HeldBy, ProcRoot: "/proc"}
	sources := []telemetry.Source{nodemetrics.GPUs(c), nodemetrics.Host(c)}
	for _, s := range extra {
		if in, ok := s.(*instances.Section); ok {
			sources = append(sources, instances.Metrics(in.Status))
		}
	}
	m.Telemetry = &agent.Telemetry{Sources: sources}
}

// devicesSection is the GPU holds section over hw: a GPU the health
// monitor finds unhealthy (an Xid NVIDIA counts as a failure, or a failed
// health check) takes no new hold; one with warnings does.
func devicesSection(hw nodekinds.Hardware, mon *health.Monitor, files devices.Files, sl devices.Slices, inVM func(string) string) *devices.Section {
	return devices.New(devices.Config{Inventory: hw.Inventory, MIGCaps: migCaps, Files: files, Slices: sl, Unhealthy: mon.Unhealthy, InVM: inVM})
}

// passthrough names the instance a GPU is passed through to, for the
// devices section, once a build composes an instances section (set
// before the agent runs); until then none.
type passthrough struct {
	inVM func(uuid string) string
	// rt is the instance runtime extraSections made (nil: none), and
	// busy the instances instance.snapshot holds, which the converger
	// leaves alone meanwhile.
	rt   vmruntime.Runtime
	busy snapshot.Busy
}

// InVM is devices.Config.InVM.
func (p *passthrough) InVM(uuid string) string {
	if p.inVM == nil {
		return ""
	}
	return p.inVM(uuid)
}

// heldGPU is gpu.reset's hold check: a held GPU is never reset.
func heldGPU(dev *devices.Section) nodekinds.Holds {
	return func(uuid string) bool { return dev.HeldBy(uuid) != "" }
}

// statusGPUs adds "held by" to bcd status's GPU lines.
func statusGPUs(hw nodekinds.Hardware, dev *devices.Section) func(context.Context) []status.GPU {
	base := nodekinds.StatusGPUs(hw)
	return func(ctx context.Context) []status.GPU {
		gs := base(ctx)
		for i := range gs {
			gs[i].HeldBy = dev.HeldBy(gs[i].UUID)
		}
		return gs
	}
}

func doctorChecks(cfg *config.Config, path string) []doctor.Check {
	dataDir := config.DefaultDataDir
	var helper []doctor.Check
	if cfg != nil {
		dataDir = cfg.DataDir
		helper = append(doctor.Helper(cfg.Helper), doctor.TSS(cfg.Helper)...)
		if cfg.Helper.Socket != "" {
			helper = append(helper, doctor.HelperTrust(cfg))
		}
		helper = append(helper, doctor.Update(cfg, update.Entrypoint), doctor.Telemetry(cfg.DataDir))
		if cfg.Helper.Socket != "" {
			helper = append(helper, doctor.VPS(cfg.Helper.User)...)
		} else {
			helper = append(helper, doctor.VPS("")...)
		}
	}
	hw, backend := hardware(dataDir)
	return append(append(withHostUnits(doctor.Base(cfg, path), unit.Real{Root: "/"}), nodekinds.DoctorChecks(hw, backend)...), helper...)
}

func main() {
	roles.Main("node", append([]cli.Command{
		agentcmd.Agent("node", "node", "run the node agent", machine),
		agentcmd.Join(),
		status.Command(),
		doctor.Command(doctorChecks),
		nodekinds.HardwareCommand(hardware),
		update.Command(),
	}, fakeCommands()...), nil)
}

// gpuUUIDs lists the machine's GPUs from its inventory.
func gpuUUIDs(hw nodekinds.Hardware) func(context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		inv, err := hw.Inventory(ctx)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, g := range inv.GPUs {
			out = append(out, g.UUID)
		}
		return out, nil
	}
}

// capabilities says in Hello what the host offers instances: its
// runtime, the acceleration root's [instances] accel gives domains, and
// GPU passthrough where the kernel made IOMMU groups. None without a
// runtime.
func capabilities(cfg *config.Config, drivers []*bcdv1.Driver, instanceDial bool) []string {
	var out []string
	for _, d := range drivers {
		if d.GetKind() == "runtime" {
			out = append(out, "vm.runtime."+d.GetId())
		}
	}
	if len(out) == 0 {
		return nil
	}
	accel := "kvm"
	if cfg.Instances.Accelerator() == config.AccelTCG {
		accel = "tcg"
	}
	out = append(out, "vm.accel."+accel)
	if es, _ := os.ReadDir("/sys/kernel/iommu_groups"); len(es) > 0 {
		out = append(out, "vm.gpu-passthrough")
	}
	if instanceDial {
		out = append(out, "tunnel.instance-dial")
	}
	return out
}
