//go:build !fakehw

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/tunnel"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/helperclient"
	hostsection "github.com/better-compute/bcd/components/host/section"
	"github.com/better-compute/bcd/components/host/unit"
	"github.com/better-compute/bcd/components/machine/access"
	"github.com/better-compute/bcd/components/machine/devices"
	"github.com/better-compute/bcd/components/machine/nodekinds"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/vm/images"
	"github.com/better-compute/bcd/components/vm/instances"
	"github.com/better-compute/bcd/components/vm/libvirtrt"
	"github.com/better-compute/bcd/components/vm/netguard"
	"github.com/better-compute/bcd/components/vm/vmruntime"
	"github.com/better-compute/bcd/components/vm/vmtunnel"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// hardware is this machine.
func hardware(dataDir string) (nodekinds.Hardware, string) {
	return nodekinds.Host{DataDir: dataDir}, "host"
}

// uploadClient is nil: uploads trust the system roots.
func uploadClient() *http.Client { return nil }

func extraKinds(string) []dispatch.Kind { return nil }

// holdFiles is where GPU hold files go: through bcd helper when bcd node
// runs unprivileged, directly as root, and nowhere (every hold fails as
// node-unprivileged) when it is neither.
func holdFiles(_ string, helper *helperclient.Client) devices.Files {
	switch {
	case helper != nil:
		return devices.DirFiles{Root: "/", Helper: helper}
	case os.Geteuid() == 0:
		return devices.DirFiles{Root: "/"}
	}
	return nil
}

// accessConfig: sshd's files through bcd helper when bcd node runs
// unprivileged, directly as root, and not at all (a section with SSH fails
// as node-unprivileged) when it is neither.
func accessConfig(_ string, helper *helperclient.Client, systemAccounts []string) access.Config {
	return access.Config{Root: "/", Helper: helper, Direct: helper == nil && os.Geteuid() == 0, SystemAccounts: systemAccounts}
}

// hostSection is the host section over this host: applied through bcd
// helper's host.unit when bcd node runs unprivileged, directly as root,
// refused (node-unprivileged) otherwise; off with [host] units = false.
func hostSection(cfg *config.Config, helper *helperclient.Client) *hostsection.Section {
	return hostsection.New(hostsection.Config{Units: unit.Standard(), System: unit.Real{Root: "/"},
		Helper: helper, Direct: helper == nil && os.Geteuid() == 0, Off: !cfg.Host.UnitsOn()})
}

// holdSlices is where holds with limits get their slice: systemd's, as
// root or through bcd helper; none where systemd is not PID 1.
func holdSlices(_ string, helper *helperclient.Client) devices.Slices {
	return devices.HostSlices(helper)
}

// migCaps is the host's nvidia-caps table.
var migCaps = devices.HostMIGCaps

// hostReboot is node.reboot on this host: through bcd helper when bcd
// node runs unprivileged, systemctl reboot as root, refused otherwise.
func hostReboot(helper *helperclient.Client) func(ctx context.Context, reason string) error {
	return func(ctx context.Context, reason string) error {
		switch {
		case helper != nil:
			return helper.Reboot(ctx, reason)
		case os.Geteuid() != 0:
			return errors.New("bcd node runs unprivileged without [helper]: it cannot reboot the host (configure [helper], or run it as root)")
		}
		out, err := exec.CommandContext(ctx, "systemctl", "reboot", "--message="+reason).CombinedOutput()
		if err != nil {
			return fmt.Errorf("systemctl reboot = %w: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	}
}

// extraSections: a host build converges no test section. Under
// [helper], the instances section runs on the libvirt-kvm runtime: reads
// through libvirtd's read-only socket, every change one of bcd helper's
// libvirt.* operations, a domain defined only from the signed section;
// base images fetched with the system's roots or their pins. Without
// [helper] there is no runtime (a section naming an instance fails); on a
// host without libvirt's client (virsh) the section is left out, so a
// node that runs no VMs converges (a spec naming instances answers
// UNSUPPORTED; installing libvirt takes a restart of bcd node).
func extraSections(cfg *config.Config, hw nodekinds.Hardware, dev *devices.Section, vms *passthrough, helper *helperclient.Client, guard *netguard.Guard) ([]converge.Section, []*bcdv1.Driver, tunnel.Instances) {
	if helper == nil {
		return nil, nil, nil
	}
	if !libvirtrt.Installed() {
		slog.Info("no libvirt on this host (virsh not found in the system directories): the instances section is left out")
		return nil, nil, nil
	}
	store, err := images.New(images.Config{Dir: filepath.Join(cfg.DataDir, "images")})
	var snaps *images.Store
	if err == nil {
		snaps, err = images.New(images.Config{Dir: filepath.Join(cfg.DataDir, "snapshots")})
	}
	if err != nil {
		slog.Warn("instances section left out", "err", err)
		return nil, nil, nil
	}
	var s *instances.Section
	rt := libvirtrt.New(libvirtrt.Config{URI: cfg.Instances.LibvirtURI(true), InstancesDir: filepath.Join(cfg.DataDir, "instances"), Helper: helper,
		Signed: func(m vmruntime.Machine) ([]byte, rootsig.Proof, error) { return s.Signed(m) }})
	s = instances.New(instances.Config{Dir: filepath.Join(cfg.DataDir, "instances"), Runtime: rt, Images: store, Snapshots: snaps,
		GPUs: gpuUUIDs(hw), HeldBy: dev.HeldBy, Network: guard.Apply, Busy: vms.busy.Has})
	vms.inVM, vms.rt = s.InVM, rt
	// Instance tickets reach a running instance's own address under the
	// loaded network policy, and its serial console through bcd helper.
	targets := vmtunnel.Targets{Guard: guard, List: rt.List, OpenConsole: rt.Console}
	return []converge.Section{s}, []*bcdv1.Driver{{Id: rt.Name(), Kind: "runtime"}}, targets
}

func fakeCommands() []cli.Command { return nil }
