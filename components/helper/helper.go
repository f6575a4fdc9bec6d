package helper

import (
	"context"
	"fmt"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/logging"
	"github.com/better-compute/bcd/components/trust/selfupdate"
)

// Config is what Serve needs of config.toml.
type Config struct {
	// Socket is [helper] socket: the absolute path the helper listens on.
	Socket string
	// User is [helper] user: the account bcd node runs as.
	User string
	// Entrypoint is [helper] entrypoint: the installed bcd node binary
	// whose processes may call, besides this helper's own binary. Empty:
	// only the helper's own binary.
	Entrypoint string
	// ConfigFile is the configuration file the settings came from; it
	// must be root's and closed to others, or Serve refuses to start. Empty
	// skips that check (tests).
	ConfigFile string
	// SystemAccounts is [access] system_accounts: root and system accounts
	// the access section may give SSH principals to.
	SystemAccounts []string
	// Update is the helper's own [update] section, for the update.*
	// operations; self-update through the helper is off without pins.
	Update UpdateConfig
	// StateDir is root's directory of trust anchors ([helper] state_dir):
	// the join record, the held trust bundle, what root applied.
	StateDir string
	// JoinSigningPin is root's join_signing_key_pin: the key whose
	// signature root takes a trust bundle (and the join record) under.
	JoinSigningPin string
	// CommandRoots are [helper] command_root_sha256.
	CommandRoots []string
	// Fake is a fakehw build's machine, handed in by the role's main; nil
	// on a host build, where GPUs come from nvidia-smi and CPUs from sysfs.
	Fake *FakeMachine
	// HostUnits are the host section's units host.unit runs, handed in by
	// the role's main (components/host/unit); nil: host.unit is refused.
	HostUnits HostUnits
	// HostOff is root's [host] units = false: every host.unit is refused.
	HostOff bool
	// Libvirt is the instances' root half the libvirt.* operations run
	// (components/vm/rootvirt), handed in by the role's main; nil: every
	// libvirt.* is refused.
	Libvirt Libvirt
	// Instances is root's [instances] section: the acceleration domains
	// get and the libvirtd they go to.
	Instances config.Instances
}

// Libvirt is what the libvirt.* operations need of the instances' root
// half: Define renders and defines one instance's domain from the
// instances section root verified; Act runs one of the other operations
// on a domain bcd's metadata names; Console opens the serial console of
// a running domain bcd's metadata names, as root, from the pty libvirt
// reports for it (never a path from the node). final marks an error
// retrying cannot mend (a refusal).
type Libvirt interface {
	Define(ctx context.Context, h LibvirtHost, id string, section []byte) (final bool, err error)
	Act(ctx context.Context, h LibvirtHost, op, id string) (final bool, err error)
	Console(ctx context.Context, h LibvirtHost, id string) (f *os.File, final bool, err error)
	// Restore resumes one instance's stopped domain from the saved memory
	// in its directory, the domain rendered from the verified section.
	Restore(ctx context.Context, h LibvirtHost, id string, section []byte) (final bool, err error)
}

// LibvirtHost is what the helper itself knows for a libvirt.* operation,
// from root's configuration and the host, never from the node.
type LibvirtHost struct {
	// DataDir is the node's data_dir from root's configuration: the
	// instances' directories are DataDir/instances/<id>, the base images
	// DataDir/images.
	DataDir string
	// Owner is the node account's uid: every disk file must be its.
	Owner uint32
	// Staging is root's own directory for saved memory states
	// (libvirt.save): [helper] state_dir/libvirt-save, never the node's.
	Staging string
	// Accel is kvm or qemu (TCG), as root's [instances] accel says.
	Accel string
	// Node is the node root is bound to (its join record): written into
	// the domains root renders, and the only node whose domains it acts
	// on, so nodes sharing one libvirtd never touch each other's.
	Node string
	// Virsh runs virsh, found in the system directories with a fixed
	// environment, on root's libvirtd, with stdin as its input.
	Virsh func(ctx context.Context, stdin []byte, args ...string) ([]byte, error)
	// GPUs lists this host's GPUs: UUID to PCI bus id (nvidia-smi's
	// pci.bus_id, e.g. 00000000:3B:00.0).
	GPUs func(ctx context.Context) (map[string]string, error)
	// Guarded says whether tap is guarded by the network policy this
	// helper loaded (netpolicy.apply), with the tables still as it left
	// them; nil: no tap is. A domain gets no tap that is not.
	Guarded func(ctx context.Context, tap string) error
}

// HostUnits is what host.unit needs of the host section's units: whether
// a unit exists, and to plan it again from the section root verified and
// apply what it finds, on the host under root ("/" on a host). final
// marks an error retrying cannot mend (invalid or unsupported settings, a
// refused change).
type HostUnits interface {
	Has(name string) bool
	Apply(ctx context.Context, root, name string, section []byte) (changed []string, final bool, err error)
}

// UpdateConfig is what the helper's update.* operations take from its
// own configuration, never from the node (docs/update.md, "Through bcd
// helper").
type UpdateConfig struct {
	// Pins and Threshold are [update] release_pins and release_threshold.
	Pins      []string
	Threshold int
	// SlotsDir is root's slots directory (selfupdate.SlotsDir): never
	// inside DataDir nor containing it.
	SlotsDir string
	// DataDir is the node's data_dir; downloads are staged in
	// DataDir/staging.
	DataDir string
	// Adopt is the installed node binary adopted into slot A before the
	// first update: [update] entrypoint, else [helper] entrypoint, else
	// DefaultEntrypoint.
	Adopt string
	// AdoptSequence is the release sequence the adopted binary is at,
	// where the release floor starts: the installed package's
	// (buildinfo.ReleaseSequence of this helper, built with it).
	AdoptSequence uint64
}

// DefaultEntrypoint is where the packages install bcd.
const DefaultEntrypoint = "/usr/bin/bcd"

// FakeMachine is what the helper of a fakehw build needs of its fake
// machine: the GPU UUIDs gpu.reset may name, the CPUs and memory nodes
// slice.apply checks cpulists against, the GPUs' device minors a CDI
// spec's device nodes may name (/dev/nvidia<minor>), and its nvidia-caps
// table (mig-minors) for MIG instances' capability nodes. The machine
// domain sits above the helper's, so the role's main builds it.
type FakeMachine struct {
	GPUs     func() []string
	Topology func() (cpus, mems string, err error)
	Minors   func() []int
	MIGCaps  func() []byte
}

// migCaps is the fake machine's nvidia-caps table; none without MIGCaps.
func (f *FakeMachine) migCaps() (cdispec.MIGCaps, error) {
	if f.MIGCaps == nil {
		return cdispec.MIGCaps{}, nil
	}
	return cdispec.ParseMIGCaps(f.MIGCaps())
}

// minors is the fake machine's GPU minors; a FakeMachine without Minors
// has none, so it allows no CDI spec.
func (f *FakeMachine) minors() ([]int, error) {
	if f.Minors == nil {
		return nil, nil
	}
	return f.Minors(), nil
}

// FromConfig takes the helper's settings from a loaded configuration.
func FromConfig(c *config.Config) Config {
	p := c.Path
	if p != "" {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
	}
	adopt := DefaultEntrypoint
	for _, e := range []string{c.Helper.Entrypoint, c.Update.Entrypoint} {
		if e != "" {
			adopt = e
		}
	}
	return Config{Socket: c.Helper.Socket, User: c.Helper.User, Entrypoint: c.Helper.Entrypoint, ConfigFile: p,
		SystemAccounts: c.Access.SystemAccounts, StateDir: c.Helper.StateDirOrDefault(), JoinSigningPin: c.JoinSigningKeyPin,
		CommandRoots: c.Helper.CommandRootSHA256, HostOff: !c.Host.UnitsOn(), Instances: c.Instances,
		Update: UpdateConfig{Pins: c.Update.ReleasePins, Threshold: c.Update.Threshold(), SlotsDir: selfupdate.SlotsDir(c),
			DataDir: c.DataDir, Adopt: adopt, AdoptSequence: buildinfo.ReleaseSequence()}}
}

// Serve checks its configuration and the host, listens on cfg.Socket and
// serves until ctx ends. It returns an error without listening when a
// check fails; see docs/helper.md for the refusals.
func Serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	return serve(ctx, cfg, log, hostSeams())
}

// Command is `bcd helper --config PATH`; fake is a fakehw build's machine
// (nil on a host build), units the host section's units host.unit runs,
// lv the instances' root half the libvirt.* operations run.
func Command(fake *FakeMachine, units HostUnits, lv Libvirt) cli.Command {
	return cli.Command{Name: "helper", Summary: "serve bcd node's privileged operations (runs as root)",
		Run: func(ctx context.Context, env *cli.Env, args []string) int {
			return run(ctx, env, args, fake, units, lv)
		}}
}

// RollbackCommand is `bcd-helper update-rollback --config PATH`: as
// root, swap back a pending self-update that current points at, record
// its version failed and restart bcd.service. The crash-loop unit runs it
// (docs/update.md, "Through bcd helper").
func RollbackCommand() cli.Command {
	return cli.Command{Name: "update-rollback", Summary: "swap back a pending self-update now and restart bcd.service (the crash-loop unit; runs as root)",
		Run: func(ctx context.Context, env *cli.Env, args []string) int {
			fs := cli.NewFlagSet(env, "bcd", "update-rollback")
			path := fs.String("config", config.DefaultPath, "the configuration file")
			noRestart := fs.Bool("no-restart", false, "swap back only; do not restart bcd.service")
			if code, ok := cli.Parse(fs, env, args, ""); !ok {
				return code
			}
			const prefix = "bcd-helper update-rollback"
			cfg, err := config.Load(*path)
			if err != nil {
				return cli.Fail(env, prefix, err)
			}
			back, err := RollbackNow(ctx, FromConfig(cfg), !*noRestart)
			if err != nil {
				return cli.Fail(env, prefix, err)
			}
			if back == "" {
				fmt.Fprintln(env.Stdout, "nothing to roll back: no pending self-update runs")
			} else {
				fmt.Fprintf(env.Stdout, "rolled back %s; it is recorded failed (bcd update --clear-failed to try it again)\n", back)
			}
			return cli.ExitOK
		}}
}

func run(ctx context.Context, env *cli.Env, args []string, fake *FakeMachine, units HostUnits, lv Libvirt) int {
	fs := cli.NewFlagSet(env, "bcd", "helper")
	path := fs.String("config", config.DefaultPath, "the configuration file; it must have a [helper] section")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	const prefix = "bcd helper"
	cfg, err := config.Load(*path)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	log, err := logging.New(env.Stderr, cfg.Log.Level, cfg.Log.Format, "helper")
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	hc := FromConfig(cfg)
	hc.Fake, hc.HostUnits, hc.Libvirt = fake, units, lv
	if err := Serve(ctx, hc, log); err != nil {
		return cli.Fail(env, prefix, err)
	}
	return cli.ExitOK
}
