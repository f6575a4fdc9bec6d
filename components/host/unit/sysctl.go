package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// Sysctl is sysctl: kernel parameters written into /proc/sys now and kept
// in /etc/sysctl.d/90-bcd.conf, which systemd-sysctl applies at boot.
type Sysctl struct{}

// SysctlBody is sysctl's settings: parameter (dotted, as sysctl names it)
// to value.
type SysctlBody struct {
	Settings map[string]string `json:"settings"`
}

// SysctlFile is the file sysctl owns.
const SysctlFile = "/etc/sysctl.d/90-bcd.conf"

// ownedSysctls are set by another unit, never by sysctl.
var ownedSysctls = map[string]string{"vm.nr_hugepages": "hugepages"}

func (Sysctl) Name() string { return "sysctl" }

func (s Sysctl) decode(body json.RawMessage) (SysctlBody, error) {
	var b SysctlBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	if len(b.Settings) > 256 {
		return b, invalid("%d settings, at most 256", len(b.Settings))
	}
	for k, v := range b.Settings {
		if len(k) > 128 || !isSysctlKey(k) {
			return b, invalid("sysctl %q is not a dotted name of [a-z0-9_-]", clip(k))
		}
		if u, ok := ownedSysctls[k]; ok {
			return b, invalid("sysctl %s is set by the %s unit", k, u)
		}
		if !isSysctlValue(v) || strings.TrimSpace(v) != v {
			return b, invalid("sysctl %s: value %q is not 1 to 256 characters of [A-Za-z0-9_.,:/+ -]", k, clip(v))
		}
	}
	return b, nil
}

func (s Sysctl) Check(body json.RawMessage) error { _, err := s.decode(body); return err }

// sysctlPath is the /proc/sys file of a dotted name.
func sysctlPath(key string) string { return "/proc/sys/" + strings.ReplaceAll(key, ".", "/") }

func (s Sysctl) render(b SysctlBody) string {
	if len(b.Settings) == 0 {
		return ""
	}
	var w strings.Builder
	w.WriteString(header(s.Name()))
	for _, k := range sortedKeys(b.Settings) {
		w.WriteString(k + " = " + b.Settings[k] + "\n")
	}
	return w.String()
}

type sysctlPlan struct {
	file string
	set  []string
}

func (s Sysctl) Plan(_ context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := s.decode(body)
	if err != nil {
		return Plan{}, err
	}
	d := sysctlPlan{file: s.render(b)}
	var p Plan
	c, err := syncFile(sys, SysctlFile, d.file)
	if err != nil {
		return Plan{}, err
	}
	if c != "" {
		p.Changes = append(p.Changes, c)
	}
	for _, k := range sortedKeys(b.Settings) {
		have, err := sys.ReadFile(sysctlPath(k))
		if err != nil {
			return Plan{}, fmt.Errorf("sysctl %s: %w (is the module that has it loaded?)", k, err)
		}
		if !sameValue(string(have), b.Settings[k]) {
			p.Changes = append(p.Changes, fmt.Sprintf("set %s = %s (now %s)", k, b.Settings[k], strings.Join(strings.Fields(string(have)), " ")))
			d.set = append(d.set, k)
		}
	}
	p.Detail = d
	return p, nil
}

// sameValue compares sysctl values as sysctl does: fields, whatever the
// spaces (the kernel prints tabs between a vector's numbers).
func sameValue(have, want string) bool {
	return strings.Join(strings.Fields(have), " ") == strings.Join(strings.Fields(want), " ")
}

func (s Sysctl) Apply(_ context.Context, sys System, body json.RawMessage, p Plan) error {
	d, ok := p.Detail.(sysctlPlan)
	if !ok {
		return fmt.Errorf("sysctl: no plan")
	}
	b, err := s.decode(body)
	if err != nil {
		return err
	}
	if err := putFile(sys, SysctlFile, d.file); err != nil {
		return err
	}
	for _, k := range d.set {
		if err := sys.WriteKernel(sysctlPath(k), b.Settings[k]); err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	return nil
}
