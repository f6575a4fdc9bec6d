package status

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
)

// Command returns `bcd status [--config PATH] [--socket PATH] [--json]`:
// it reads the running agent's Snapshot from the socket config.toml's
// socket_path names (--socket overrides it; without a configuration file at
// the default path it uses the default socket) and prints it as text or
// JSON. It exits 1 when the configuration does not load or the socket
// cannot be read.
func Command() cli.Command {
	return cli.Command{Name: "status", Summary: "ask the running agent for its state", Run: run}
}

func run(ctx context.Context, env *cli.Env, args []string) int {
	flags := cli.NewFlagSet(env, "bcd", "status")
	cfgPath := flags.String("config", config.DefaultPath, "the configuration file, for socket_path")
	socket := flags.String("socket", "", "the status socket (default: socket_path from --config, else "+config.DefaultSocketPath+")")
	asJSON := flags.Bool("json", false, "print the snapshot as JSON")
	if code, ok := cli.Parse(flags, env, args, ""); !ok {
		return code
	}
	path, err := socketPath(flags, *cfgPath, *socket)
	if err != nil {
		return cli.Fail(env, "bcd status", err)
	}
	s, err := Read(ctx, path)
	if err != nil {
		return cli.Fail(env, "bcd status", err)
	}
	if *asJSON {
		s.normalize()
		b, err := json.MarshalIndent(s, "", "  ")
		if err != nil {
			return cli.Fail(env, "bcd status", fmt.Errorf("encode status: %w", err))
		}
		fmt.Fprintf(env.Stdout, "%s\n", b)
		return cli.ExitOK
	}
	Render(env.Stdout, s)
	return cli.ExitOK
}

// socketPath picks the socket: --socket, else socket_path from the
// configuration file. A missing file at the default path (a ramdisk has
// none) falls back to the default socket; a missing file named with
// --config is an error.
func socketPath(flags *flag.FlagSet, cfgPath, socket string) (string, error) {
	if socket != "" {
		return socket, nil
	}
	explicit := false
	flags.Visit(func(f *flag.Flag) {
		if f.Name == "config" {
			explicit = true
		}
	})
	cfg, err := config.Load(cfgPath)
	if err != nil {
		if !explicit && errors.Is(err, fs.ErrNotExist) {
			return config.DefaultSocketPath, nil
		}
		return "", fmt.Errorf("find the status socket: %w", err)
	}
	return cfg.SocketPath, nil
}

// labelWidth is the width of the label column of Render.
const labelWidth = 12

// Render writes s as text: one line per group of fields, then one line per
// running and deferred command and per GPU.
func Render(w io.Writer, s Snapshot) {
	line := func(label, format string, a ...any) {
		fmt.Fprintf(w, "%-*s%s\n", labelWidth, label, clean(fmt.Sprintf(format, a...)))
	}
	line("node", "%s (site %s, role %s)", or(s.NodeID), or(s.Site), or(s.Role))
	line("boot", "%s, version %s", or(s.BootID), or(s.Version))
	switch {
	case s.Connected && !s.SessionSince.IsZero():
		line("gateway", "%s, connected since %s (epoch %d)", or(s.Gateway), stamp(s.SessionSince), s.Epoch)
	case s.Connected:
		line("gateway", "%s, connected (epoch %d)", or(s.Gateway), s.Epoch)
	case s.Epoch > 0:
		line("gateway", "%s, not connected (last epoch %d)", or(s.Gateway), s.Epoch)
	default:
		line("gateway", "%s, not connected", or(s.Gateway))
	}
	line("clock", "offset %+dms, time mark %s", s.ClockOffsetMS, stamp(s.TimeMark))
	if s.SignedIntent.Enforced {
		line("trust", "bundle version %d; signed intent enforced (%d command-signing roots)", s.SignedIntent.TrustBundleVersion, s.SignedIntent.Roots)
	} else {
		line("trust", "bundle version %d; signed intent NOT enforced (no command-signing roots)", s.SignedIntent.TrustBundleVersion)
	}
	if a := s.SignedIntent.Approvers; a != nil {
		line("approvers", "epoch %d, %d of %d keys approve destructive batches", a.Epoch, a.Threshold, a.Keys)
	}
	if s.SignedIntent.ApproversRefused != "" {
		line("approvers", "the last bundle's set was refused: %s", s.SignedIntent.ApproversRefused)
	}
	line("generation", "applied %d, observed %d", s.Converge.Applied, s.Converge.Observed)
	if s.Converge.SpecError != "" {
		line("spec refused", "generation %d: %s", s.Converge.RefusedGeneration, s.Converge.SpecError)
	}
	for _, x := range s.Converge.Sections {
		text := fmt.Sprintf("%s at generation %d since %s", x.State, x.Generation, stamp(x.Since))
		if x.Attempts > 0 {
			text += fmt.Sprintf(", %d attempts", x.Attempts)
		}
		if x.Message != "" {
			text += ": " + x.Message
		}
		line("  "+x.Name, "%s", text)
		for _, c := range x.Changes {
			fmt.Fprintf(w, "    %s\n", clean(c))
		}
	}
	for _, u := range s.HostUnits {
		text := u.Name + " " + u.State
		if u.Message != "" {
			text += ": " + u.Message
		}
		line("    unit", "%s", text)
		for _, c := range u.Changes {
			fmt.Fprintf(w, "    %s\n", clean(c))
		}
	}
	if len(s.Conditions) > 0 {
		line("conditions", "%d", len(s.Conditions))
		for _, c := range s.Conditions {
			fmt.Fprintf(w, "  %s\n", clean(fmt.Sprintf("%s %s since %s: %s", c.Type, or(c.Subject), stamp(c.Since), c.Message)))
		}
	}
	lanes := make([]string, len(s.Lanes))
	for i, l := range s.Lanes {
		lanes[i] = fmt.Sprintf("%s %d/%d free", l.Lane, l.Free, l.Size)
	}
	line("lanes", "%s", or(strings.Join(lanes, ", ")))
	line("events", "backlog %d, dropped %d; results unacked %d", s.EventBacklog, s.EventsDropped, s.ResultsUnacked)
	switch {
	case s.CertificateNotAfter.IsZero():
		line("certificate", "%s", or(s.CertificateValidFor))
	case s.CertificateValidFor == "expired":
		line("certificate", "expired at %s", stamp(s.CertificateNotAfter))
	default:
		line("certificate", "valid for %s (until %s)", or(s.CertificateValidFor), stamp(s.CertificateNotAfter))
	}
	switch s.KeyHolder {
	case KeyInFile:
		line("node key", "in a file")
	default:
		line("node key", "%s", or(s.KeyHolder))
	}
	if s.BootLease != nil {
		if s.BootLease.Held {
			line("boot lease", "held, valid for %s", s.BootLease.ValidFor)
		} else {
			line("boot lease", "not held (another site agent answers PXE)")
		}
	}
	jobs := func(label string, l []Job) {
		line(label, "%d", len(l))
		for _, j := range l {
			fmt.Fprintf(w, "  %s\n", clean(fmt.Sprintf("%s %s, lane %s, since %s", or(j.ID), or(j.Kind), or(j.Lane), stamp(j.Started))))
		}
	}
	jobs("running", s.Running)
	jobs("deferred", s.Deferred)
	line("gpus", "%d", len(s.GPUs))
	for _, g := range s.GPUs {
		fmt.Fprintf(w, "  %s\n", clean(fmt.Sprintf("%d %s %s: %.0f%% %.0f C %.0f/%.0f W %.1f/%.1f GiB",
			g.Index, or(g.UUID), or(g.Name), g.UtilizationPct, g.TemperatureC, g.PowerW, g.PowerLimitW,
			gib(g.MemoryUsedMiB), gib(g.MemoryTotalMiB))+heldBy(g.HeldBy)+health(g)))
	}
	if len(s.Taps) > 0 {
		line("taps", "%d", len(s.Taps))
	}
	for _, t := range s.Taps {
		text := fmt.Sprintf("%s %s %s %s", or(t.Tap), or(t.Instance), or(t.Policy), or(t.State))
		if t.Reason != "" {
			text += ": " + t.Reason
		}
		fmt.Fprintf(w, "  %s\n", clean(text))
	}
	if c := s.InstancesComplete; c != nil {
		listed := "complete"
		if !*c {
			listed = "INCOMPLETE: the runtime could not list its domains"
		}
		line("instances", "%d, %s", len(s.Instances), listed)
	}
	for _, in := range s.Instances {
		text := in.ID + " " + or(in.State)
		if in.State != "" && !in.Owned {
			text += " not bcd's (never touched)"
		}
		if in.Failed != "" {
			text += " failed: " + in.Failed
		}
		fmt.Fprintf(w, "  %s\n", clean(text))
	}
	if t := s.Telemetry; t != nil {
		text := fmt.Sprintf("%s, last export %s", or(t.Endpoint), stamp(t.LastExport))
		if t.LastError != "" {
			text += fmt.Sprintf(", last error %s: %s", stamp(t.LastErrorAt), t.LastError)
		}
		line("telemetry", "%s (%d points exported, %d dropped, %d batches waiting)", text, t.ExportedPoints, t.DroppedPoints, t.PendingBatches)
	}
	if len(s.Tunnels) > 0 {
		line("tunnels", "%d", len(s.Tunnels))
	}
	for _, t := range s.Tunnels {
		kind := or(t.Kind)
		if t.Instance != "" {
			kind += " to instance " + t.Instance
		}
		fmt.Fprintf(w, "  %s\n", clean(fmt.Sprintf("%s %s as %s, ticket %s, since %s, until %s, %d bytes in, %d out",
			or(t.ID), kind, or(t.Account), or(t.JTI), stamp(t.Opened), stamp(t.Expires), t.BytesIn, t.BytesOut)))
	}
}

// health is a GPU line's verdict when it is not ok: "; UNHEALTHY: …" or
// "; warn: …" with the problems.
func health(g GPU) string {
	switch g.Health {
	case "", HealthOK:
		return ""
	}
	s := "; " + g.Health
	if len(g.Problems) > 0 {
		s += ": " + strings.Join(g.Problems, "; ")
	}
	return s
}

func gib(mib int64) float64 { return float64(mib) / 1024 }

// or stands "-" in for an empty value.
func or(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stamp formats t in UTC to the second, "-" when zero.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// clean replaces control characters, so a value cannot move the cursor or
// start a new line on the operator's terminal.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}

// heldBy is a GPU line's hold, if any.
func heldBy(alloc string) string {
	if alloc == "" {
		return ""
	}
	return ", held by " + alloc
}
