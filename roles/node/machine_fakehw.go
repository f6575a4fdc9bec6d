//go:build fakehw

package main

import (
	"context"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/better-compute/bcd/components/agent/agentcmd"
	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/tunnel"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/helperclient"
	hostsection "github.com/better-compute/bcd/components/host/section"
	"github.com/better-compute/bcd/components/machine/access"
	"github.com/better-compute/bcd/components/machine/devices"
	"github.com/better-compute/bcd/components/machine/fakehw"
	"github.com/better-compute/bcd/components/machine/fakehw/fakehttp"
	"github.com/better-compute/bcd/components/machine/fakekinds"
	"github.com/better-compute/bcd/components/machine/health"
	"github.com/better-compute/bcd/components/machine/nodekinds"
	"github.com/better-compute/bcd/components/vm/fakeruntime"
	"github.com/better-compute/bcd/components/vm/images"
	"github.com/better-compute/bcd/components/vm/instances"
	"github.com/better-compute/bcd/components/vm/netguard"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// hardware is the fake machine of BCD_FAKEHW_SEED (default 1).
func hardware(dataDir string) (nodekinds.Hardware, string) {
	seed := int64(1)
	if v := os.Getenv("BCD_FAKEHW_SEED"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			seed = n
		}
	}
	return fakehw.Hardware{Seed: seed, DataDir: dataDir}, "fakehw"
}

// uploadClient also trusts $BCD_FAKEHW_EXTRA_CA (tests' upload servers).
func uploadClient() *http.Client { return fakehttp.Client() }

// extraKinds are the test kinds of a fakehw build.
func extraKinds(dataDir string) []dispatch.Kind { return fakekinds.Kinds(dataDir) }

// holdFiles keeps a fakehw node's GPU hold files under
// data_dir/fakehw/root (its /etc/cdi and /run/bcd-alloc), or through bcd
// helper when configured.
func holdFiles(dataDir string, helper *helperclient.Client) devices.Files {
	if helper != nil {
		return devices.DirFiles{Root: "/", Helper: helper}
	}
	return devices.DirFiles{Root: filepath.Join(dataDir, "fakehw", "root")}
}

// accessConfig: a fakehw node keeps sshd's files under
// data_dir/fakehw/root (a test's own sshd reads them there), or applies
// them through bcd helper when configured.
func accessConfig(dataDir string, helper *helperclient.Client, systemAccounts []string) access.Config {
	if helper != nil {
		// The root end-to-end test's helper (a helpere2e build) keeps the
		// files under BCD_FAKEHW_ACCESS_ROOT; the node reads them there.
		root := "/"
		if d := os.Getenv("BCD_FAKEHW_ACCESS_ROOT"); d != "" {
			root = d
		}
		return access.Config{Root: root, Helper: helper}
	}
	return access.Config{Root: filepath.Join(dataDir, "fakehw", "root"), Direct: true, SystemAccounts: systemAccounts}
}

// holdSlices keeps a fakehw node's slice drop-ins under
// data_dir/fakehw/root, with no systemd to start them: the fake machine
// has none (a fakehw helper only logs slice.apply). With
// BCD_FAKEHW_HOST_SLICES=1 (the systemd tier: fake GPUs on a machine
// where systemd is PID 1) they are the host's real slices.
func holdSlices(dataDir string, helper *helperclient.Client) devices.Slices {
	if os.Getenv("BCD_FAKEHW_HOST_SLICES") == "1" {
		return devices.HostSlices(helper)
	}
	return devices.DirSlices{Root: filepath.Join(dataDir, "fakehw", "root"), Cgroup: filepath.Join(dataDir, "fakehw", "cgroup"),
		Systemctl: func(context.Context, ...string) error { return nil }}
}

// migCaps is the fake machine's nvidia-caps table.
func migCaps() (cdispec.MIGCaps, error) { return cdispec.ParseMIGCaps(fakehw.MIGCaps()) }

// hostSection: a fakehw node has no host section (UNSUPPORTED): its
// units are tested against unit.Fake in components/host.
func hostSection(*config.Config, *helperclient.Client) *hostsection.Section { return nil }

// hostReboot: a fakehw node simulates node.reboot (agent.Config.FakeReboot).
func hostReboot(*helperclient.Client) func(context.Context, string) error { return nil }

// extraSections are the instances section on the file-backed runtime
// and the fakehw test section; the file-backed runtime is no driver
// Hello lists.
func extraSections(cfg *config.Config, hw nodekinds.Hardware, dev *devices.Section, vms *passthrough, _ *helperclient.Client, _ *netguard.Guard) ([]converge.Section, []*bcdv1.Driver, tunnel.Instances) {
	return fakeSections(cfg.DataDir, hw, dev, vms), nil, nil
}

func fakeSections(dataDir string, hw nodekinds.Hardware, dev *devices.Section, vms *passthrough) []converge.Section {
	return append(instancesSection(dataDir, hw, dev, vms), fakekinds.Section(dataDir))
}

// instancesSection runs the instances section on the fake runtime, whose
// records are in data_dir/fakehw/runtime (no guest runs): base images in
// data_dir/images, fetched with the fakehw roots, disks by qemu-img, the
// fake machine's GPUs passed through unless a hold has them (and no hold
// beside a GPU an instance has). A data directory it cannot set up
// leaves the section out (UNSUPPORTED), logged.
func instancesSection(dataDir string, hw nodekinds.Hardware, dev *devices.Section, vms *passthrough) []converge.Section {
	store, err := images.New(images.Config{Dir: filepath.Join(dataDir, "images"), Roots: fakehttp.Roots()})
	var snaps *images.Store
	if err == nil {
		snaps, err = images.New(images.Config{Dir: filepath.Join(dataDir, "snapshots"), Roots: fakehttp.Roots()})
	}
	if err == nil {
		var rt *fakeruntime.Runtime
		if rt, err = fakeruntime.New(filepath.Join(dataDir, "fakehw", "runtime"), nil); err == nil {
			s := instances.New(instances.Config{Dir: filepath.Join(dataDir, "instances"), Runtime: rt, Images: store, Snapshots: snaps,
				GPUs: gpuUUIDs(hw), HeldBy: dev.HeldBy, Busy: vms.busy.Has})
			vms.inVM, vms.rt = s.InVM, rt
			return []converge.Section{s}
		}
	}
	slog.Warn("instances section left out", "err", err)
	return nil
}

// fakeCommands are the commands only a fakehw build has.
func fakeCommands() []cli.Command {
	return []cli.Command{agentcmd.Sim(func(dataDir string, seed int64) agentcmd.Machine {
		hw := fakehw.Hardware{Seed: seed, DataDir: dataDir}
		mon := health.New(health.Config{HW: hw, Log: slog.New(slog.DiscardHandler)})
		vms := &passthrough{}
		dev := devicesSection(hw, mon, holdFiles(dataDir, nil), holdSlices(dataDir, nil), vms.InVM)
		m := agentcmd.Machine{Kinds: append(nodekinds.Kinds(hw, heldGPU(dev)), fakekinds.Kinds(dataDir)...), StatusGPUs: statusGPUs(hw, dev),
			Sections: append([]converge.Section{dev}, fakeSections(dataDir, hw, dev, vms)...)}
		withReport(&m)
		// BCD_SIM_NO_REPORT=1: no health monitor (conditions, pressure,
		// inventory), for make bench's reference run.
		if os.Getenv("BCD_SIM_NO_REPORT") == "" {
			withHealth(&m, mon)
		}
		return m
	})}
}
