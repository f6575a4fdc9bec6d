package unit

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// The kernel command line goes through the boot loader the host has:
// GRUB, with one drop-in per unit in /etc/default/grub.d (which Debian's
// grub-mkconfig reads after /etc/default/grub) and update-grub. bcd edits
// no file it does not own; a host without GRUB's tools fails the unit
// (kernel-install and BLS entries are not supported yet, docs/host.md).

// GrubDropIn is the drop-in a unit owns.
func GrubDropIn(unit string) string { return "/etc/default/grub.d/60-bcd-" + unit + ".cfg" }

// GrubConfig is the configuration update-grub renders.
const GrubConfig = "/boot/grub/grub.cfg"

func renderDropIn(unit string, args []string) string {
	if len(args) == 0 {
		return ""
	}
	return header(unit) + `GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX ` + strings.Join(args, " ") + "\"\n"
}

// hasGrub reports whether the host has GRUB's configuration tools.
func hasGrub(sys System) bool { return sys.Has("update-grub") || sys.Has("grub-mkconfig") }

// cmdlinePlan is a unit's part of the kernel command line.
type cmdlinePlan struct {
	unit    string
	dropIn  string
	changed bool
}

// planCmdline compares a unit's drop-in with args and /proc/cmdline with
// what the drop-in asks: an argument the running kernel lacks raises
// RebootRequired.
func planCmdline(sys System, unit string, args []string, p *Plan) (cmdlinePlan, error) {
	d := cmdlinePlan{unit: unit, dropIn: renderDropIn(unit, args)}
	if len(args) > 0 && !hasGrub(sys) {
		return d, fmt.Errorf("%w: %s needs the kernel command line (%s) and this host has no boot loader bcd configures (GRUB's update-grub or grub-mkconfig; kernel-install/BLS is not supported yet)",
			ErrUnsupported, unit, strings.Join(args, " "))
	}
	c, err := syncFile(sys, GrubDropIn(unit), d.dropIn)
	if err != nil {
		return d, err
	}
	if c != "" {
		p.Changes = append(p.Changes, c+" and run update-grub")
		d.changed = true
	} else if len(args) > 0 {
		// The drop-in is there; a configuration rendered before it (a
		// crash between the two) is rendered again.
		if cfg, err := sys.ReadFile(GrubConfig); err == nil && !allIn(string(cfg), args) {
			p.Changes = append(p.Changes, "run update-grub ("+GrubConfig+" lacks "+strings.Join(args, " ")+")")
			d.changed = true
		}
	}
	if len(args) > 0 {
		running, err := sys.ReadFile("/proc/cmdline")
		if err != nil {
			return d, fmt.Errorf("read /proc/cmdline: %w", err)
		}
		have := strings.Fields(string(running))
		var missing []string
		for _, a := range args {
			if !slices.Contains(have, a) {
				missing = append(missing, a)
			}
		}
		if len(missing) > 0 {
			p.Conditions = append(p.Conditions, Condition{RebootRequired,
				fmt.Sprintf("%s: the running kernel's command line lacks %s (the boot loader has it from the next boot: node.reboot)", unit, strings.Join(missing, " "))})
		}
	}
	return d, nil
}

func allIn(cfg string, args []string) bool {
	for _, a := range args {
		if !strings.Contains(cfg, a) {
			return false
		}
	}
	return true
}

// applyCmdline writes the drop-in and renders GRUB's configuration again.
func applyCmdline(ctx context.Context, sys System, d cmdlinePlan) error {
	if !d.changed {
		return nil
	}
	if err := putFile(sys, GrubDropIn(d.unit), d.dropIn); err != nil {
		return err
	}
	if !hasGrub(sys) {
		return nil // nothing asked, nothing to render
	}
	if sys.Has("update-grub") {
		_, err := sys.Run(ctx, "update-grub")
		return err
	}
	_, err := sys.Run(ctx, "grub-mkconfig", "-o", GrubConfig)
	return err
}
