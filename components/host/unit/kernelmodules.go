package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// KernelModules is kernel-modules: modules loaded now (by
// systemd-modules-load under systemd, else modprobe), listed
// in /etc/modules-load.d/bcd.conf for systemd-modules-load at boot, with
// their options in /etc/modprobe.d/zz-bcd.conf.
type KernelModules struct{}

// KernelModulesBody is kernel-modules' settings.
type KernelModulesBody struct {
	Modules []Module `json:"modules"`
}

// Module is one kernel module and its options.
type Module struct {
	Name    string            `json:"name"`
	Options map[string]string `json:"options,omitempty"`
}

// Files kernel-modules owns.
const (
	ModulesLoadFile = "/etc/modules-load.d/bcd.conf"
	// ModprobeFile sorts after the distribution's files: kmod reads
	// every options line of a module in file name order and the module
	// takes the last value, and systemd ships systemd.conf with
	// "options dummy numdummies=0" (and bonding's max_bonds=0), which
	// would win over a file named bcd.conf.
	ModprobeFile = "/etc/modprobe.d/zz-bcd.conf"
)

var (
	maxModules = 64
	maxParams  = 32
)

func (KernelModules) Name() string { return "kernel-modules" }

func (k KernelModules) decode(body json.RawMessage) (KernelModulesBody, error) {
	var b KernelModulesBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	if len(b.Modules) > maxModules {
		return b, invalid("%d modules, at most %d", len(b.Modules), maxModules)
	}
	seen := map[string]bool{}
	for _, m := range b.Modules {
		if !isModuleName(m.Name) {
			return b, invalid("module name %q is not [a-z0-9_-], 1 to 56 characters", clip(m.Name))
		}
		n := strings.ReplaceAll(m.Name, "-", "_")
		if seen[n] {
			return b, invalid("module %s is named twice", m.Name)
		}
		seen[n] = true
		if len(m.Options) > maxParams {
			return b, invalid("module %s: %d options, at most %d", m.Name, len(m.Options), maxParams)
		}
		for p, v := range m.Options {
			if !isParamName(p) || !isParamValue(v) {
				return b, invalid("module %s: option %q=%q: a name of [a-z0-9_] and a value of [A-Za-z0-9_.,:+-]", m.Name, clip(p), clip(v))
			}
		}
	}
	return b, nil
}

func (k KernelModules) Check(body json.RawMessage) error { _, err := k.decode(body); return err }

// render answers the two files' content ("" when there is nothing to
// list).
func (k KernelModules) render(b KernelModulesBody) (load, opts string) {
	if len(b.Modules) == 0 {
		return "", ""
	}
	var l, o strings.Builder
	l.WriteString(header(k.Name()))
	for _, m := range b.Modules {
		l.WriteString(m.Name + "\n")
		if len(m.Options) > 0 {
			o.WriteString("options " + m.Name)
			for _, p := range sortedKeys(m.Options) {
				o.WriteString(" " + p + "=" + m.Options[p])
			}
			o.WriteString("\n")
		}
	}
	if o.Len() > 0 {
		return l.String(), header(k.Name()) + o.String()
	}
	return l.String(), ""
}

// loaded reports whether the module is in the running kernel (loaded or
// built in): /sys/module/<name>.
func loaded(sys System, name string) bool {
	return sys.Exists("/sys/module/" + strings.ReplaceAll(name, "-", "_"))
}

type modulesPlan struct {
	load, opts string
	modprobe   []Module
}

func (k KernelModules) Plan(_ context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := k.decode(body)
	if err != nil {
		return Plan{}, err
	}
	var p Plan
	d := modulesPlan{}
	d.load, d.opts = k.render(b)
	for _, f := range []struct{ name, want string }{{ModulesLoadFile, d.load}, {ModprobeFile, d.opts}} {
		c, err := syncFile(sys, f.name, f.want)
		if err != nil {
			return Plan{}, err
		}
		if c != "" {
			p.Changes = append(p.Changes, c)
		}
	}
	for _, m := range b.Modules {
		if !loaded(sys, m.Name) {
			p.Changes = append(p.Changes, "modprobe "+m.Name)
			d.modprobe = append(d.modprobe, m)
			continue
		}
		// A loaded module keeps the options it was loaded with.
		for _, opt := range sortedKeys(m.Options) {
			have, err := sys.ReadFile("/sys/module/" + strings.ReplaceAll(m.Name, "-", "_") + "/parameters/" + opt)
			if err != nil {
				continue // not shown in sysfs: cannot tell
			}
			if strings.TrimSpace(string(have)) != m.Options[opt] {
				p.Conditions = append(p.Conditions, Condition{RebootRequired,
					fmt.Sprintf("kernel-modules: %s is loaded with %s=%s, want %s (taken when it is loaded again, at the latest at the next boot)",
						m.Name, opt, strings.TrimSpace(string(have)), m.Options[opt])})
			}
		}
	}
	p.Detail = d
	return p, nil
}

func (k KernelModules) Apply(ctx context.Context, sys System, body json.RawMessage, p Plan) error {
	d, ok := p.Detail.(modulesPlan)
	if !ok {
		return fmt.Errorf("kernel-modules: no plan")
	}
	if err := putFile(sys, ModprobeFile, d.opts); err != nil {
		return err
	}
	if err := putFile(sys, ModulesLoadFile, d.load); err != nil {
		return err
	}
	if len(d.modprobe) == 0 {
		return nil
	}
	if sys.Exists("/run/systemd/system") && sys.Has("systemctl") {
		// Under systemd, systemd-modules-load loads what the file lists
		// with the options of /etc/modprobe.d, as at boot: bcd helper
		// itself needs no CAP_SYS_MODULE.
		if _, err := sys.Run(ctx, "systemctl", "restart", "systemd-modules-load.service"); err != nil {
			return fmt.Errorf("loading %s: %w", moduleNames(d.modprobe), err)
		}
		return nil
	}
	for _, m := range d.modprobe {
		// The options go on the command line too: modprobe reads the
		// host's /etc/modprobe.d, which a test's root is not.
		args := []string{"--", m.Name}
		for _, o := range sortedKeys(m.Options) {
			args = append(args, o+"="+m.Options[o])
		}
		if _, err := sys.Run(ctx, "modprobe", args...); err != nil {
			return err
		}
	}
	return nil
}

func moduleNames(ms []Module) string {
	var n []string
	for _, m := range ms {
		n = append(n, m.Name)
	}
	return strings.Join(n, ", ")
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
