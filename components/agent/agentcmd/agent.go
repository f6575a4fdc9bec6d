package agentcmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/better-compute/bcd/components/agent"
	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/report"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/agent/update"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/logging"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Machine is what a role's main wires into its agent for this machine.
type Machine struct {
	Kinds      []dispatch.Kind
	StatusGPUs func(context.Context) []status.GPU
	// StatusHost, when set, gives bcd status the host units' states.
	StatusHost func() []status.HostUnit
	// StatusTaps, when set, gives bcd status the instances' taps.
	StatusTaps func() []status.Tap
	// InstanceTokens, when set, is given the session's instance token
	// fetch (agent.Config.InstanceTokens).
	InstanceTokens func(get func(ctx context.Context, instance, audience string) (string, error))
	// StatusInstances, when set, gives bcd status the instances' domains.
	StatusInstances func() ([]status.Instance, bool)
	BootLease       func() (held bool, left time.Duration)
	// Sections are the NodeSpec sections the role converges.
	Sections []converge.Section
	// Report is what the role reports about its machine (conditions,
	// pressure, inventory); Watch keeps it current beside the agent.
	Report report.Machine
	Watch  func(ctx context.Context, changed func()) error
	// ReportSections, when set, is given the function that sets the
	// role's own report sections (a JSON object).
	ReportSections func(set func([]byte))
	// Kicker, when set, is given the converge engine's Kick.
	Kicker func(kick func())
	// Beside, when set, runs beside the agent (the site's boot server);
	// its failure stops the agent with exit 1.
	Beside func(ctx context.Context) error
	// Drivers, when set, lists the hosted bcx drivers for Hello.
	Drivers func() []*bcdv1.Driver
	// Capabilities, when set, says in Hello what the host offers.
	Capabilities func() []string
	// Tunnels is what the role's tunnels open.
	Tunnels agent.Tunnels
	// Reboot, when set, reboots the host for node.reboot (a fakehw node
	// simulates it instead).
	Reboot func(ctx context.Context, reason string) error
	// Update, when set, is self-update (daemon.upgrade, the daemon
	// section, the confirmation on the first Welcome); UpdateExec is the
	// slots' current link, which the agent executes at start when it is
	// another binary (update.Trampoline) and after a swap.
	Update     *update.Agent
	UpdateExec string
	// Telemetry, when set, gives the role the telemetry section with
	// these metric sources beside the agent's own.
	Telemetry *agent.Telemetry
}

// ExitError is a machine's refusal to start with the exit code to use.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Agent returns an agent mode command (`bcd node`, `bcd site`): it loads
// config.toml and runs the agent with what the role's main built.
func Agent(name, role, summary string, machine func(*config.Config, *slog.Logger) (Machine, error)) cli.Command {
	return cli.Command{Name: name, Summary: summary, Run: func(ctx context.Context, env *cli.Env, args []string) int {
		fs := cli.NewFlagSet(env, "bcd", name)
		path := fs.String("config", config.DefaultPath, "the configuration file")
		if code, ok := cli.Parse(fs, env, args, ""); !ok {
			return code
		}
		prefix := "bcd " + name
		cfg, err := config.Load(*path)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		log, err := logging.New(env.Stderr, cfg.Log.Level, cfg.Log.Format, "")
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		var m Machine
		if machine != nil {
			if m, err = machine(cfg, log); err != nil {
				var ee *ExitError
				if errors.As(err, &ee) && ee.Code == cli.ExitUsage {
					return cli.Usagef(env, "%s: %v", prefix, ee.Err)
				}
				return cli.Fail(env, prefix, err)
			}
		}
		if m.Update != nil && m.UpdateExec != "" {
			if err := update.Trampoline(ctx, m.Update.Installer, m.UpdateExec, log); err != nil {
				return cli.Fail(env, prefix, err)
			}
		}
		ac := agent.Config{Config: cfg, Role: role, Kinds: m.Kinds, StatusGPUs: m.StatusGPUs, StatusHost: m.StatusHost, StatusTaps: m.StatusTaps, InstanceTokens: m.InstanceTokens, StatusInstances: m.StatusInstances, Sections: m.Sections,
			Machine: m.Report, Watch: m.Watch, ReportSections: m.ReportSections, Kicker: m.Kicker,
			BootLease: m.BootLease, Drivers: m.Drivers, Capabilities: m.Capabilities, Tunnels: m.Tunnels, Telemetry: m.Telemetry, Version: buildinfo.Version, Log: log,
			FakeReboot: buildinfo.FakeHW && role == "node", Reboot: m.Reboot}
		if m.Update != nil {
			m.Update.Start(ctx)
			ac.Kinds = append(ac.Kinds, m.Update.Kind())
			ac.Sections = append(ac.Sections, m.Update.Section())
			ac.Welcomed, ac.Restarter = m.Update.Welcomed, m.Update.SetRestart
		}
		if v := env.Getenv("BCD_RENEW_AFTER"); v != "" && buildinfo.FakeHW {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cli.Usagef(env, "%s: BCD_RENEW_AFTER=%q is not a positive Go duration", prefix, v)
			}
			ac.RenewAfter = d
		}
		if t := agentTPM(env.Getenv, role, cfg, log); t != nil {
			defer t.Close()
			ac.TPM = t
		}
		actx, stop := context.WithCancel(ctx)
		defer stop()
		besideErr := make(chan error, 1)
		if m.Beside != nil {
			go func() {
				err := m.Beside(actx)
				if err != nil && actx.Err() == nil {
					stop()
				}
				besideErr <- err
			}()
		} else {
			besideErr <- nil
		}
		err = agent.Run(actx, ac)
		stop()
		if berr := <-besideErr; berr != nil && err == nil && ctx.Err() == nil {
			err = berr
		}
		switch {
		case err == nil:
			return 0
		case errors.Is(err, agent.ErrRebooted):
			// fakehw: "reboot" by executing this binary again.
			exe, xerr := os.Executable()
			if xerr == nil {
				xerr = syscall.Exec(exe, os.Args, os.Environ())
			}
			return cli.Fail(env, prefix, fmt.Errorf("re-exec after a fakehw reboot: %w", xerr))
		case errors.Is(err, agent.ErrRestart) && m.UpdateExec != "":
			return cli.Fail(env, prefix, update.Exec(m.UpdateExec))
		case errors.Is(err, session.ErrRevoked):
			fmt.Fprintln(env.Stderr, err)
			return 1
		default:
			return cli.Fail(env, prefix, err)
		}
	}}
}
