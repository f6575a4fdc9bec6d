package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// NvidiaDriver is nvidia-driver: the NVIDIA driver package at a pinned
// version from the host's package manager (apt): a pin in
// /etc/apt/preferences.d/bcd-nvidia-driver, then apt-get install of that
// version. A kernel module other than the installed version raises
// RebootRequired (the module in use is replaced only at boot).
type NvidiaDriver struct{}

// NvidiaDriverBody is nvidia-driver's settings.
type NvidiaDriverBody struct {
	// Version is the package version (550.54.15-1).
	Version string `json:"version"`
	// Package is the package name (default nvidia-driver).
	Package string `json:"package,omitempty"`
}

// NvidiaPinFile is the apt pin nvidia-driver owns.
const NvidiaPinFile = "/etc/apt/preferences.d/bcd-nvidia-driver"

func (NvidiaDriver) Name() string { return "nvidia-driver" }

func (n NvidiaDriver) decode(body json.RawMessage) (NvidiaDriverBody, error) {
	var b NvidiaDriverBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	if absent(body) {
		return b, nil
	}
	if b.Package == "" {
		b.Package = "nvidia-driver"
	}
	if !isDebVersion(b.Version) {
		return b, invalid("version %q is not a package version", clip(b.Version))
	}
	if !isPackageName(b.Package) {
		return b, invalid("package %q is not a package name", clip(b.Package))
	}
	return b, nil
}

func (n NvidiaDriver) Check(body json.RawMessage) error { _, err := n.decode(body); return err }

// upstream is a package version's upstream part (550.54.15 of
// 550.54.15-1), what the kernel module reports.
func upstream(v string) string {
	if _, after, ok := strings.Cut(v, ":"); ok {
		v = after
	}
	if i := strings.LastIndex(v, "-"); i > 0 {
		v = v[:i]
	}
	return v
}

type driverPlan struct {
	pin     string
	install bool
}

func (n NvidiaDriver) Plan(ctx context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := n.decode(body)
	if err != nil {
		return Plan{}, err
	}
	var p Plan
	var d driverPlan
	if b.Version != "" {
		d.pin = header(n.Name()) + "Package: " + b.Package + "\nPin: version " + b.Version + "\nPin-Priority: 1001\n"
	}
	c, err := syncFile(sys, NvidiaPinFile, d.pin)
	if err != nil {
		return Plan{}, err
	}
	if c != "" {
		p.Changes = append(p.Changes, c)
	}
	if b.Version == "" {
		p.Detail = d
		return p, nil
	}
	out, err := sys.Run(ctx, "dpkg-query", "-W", "-f=${Status}|${Version}", b.Package)
	have := ""
	if err == nil {
		status, v, _ := strings.Cut(string(out), "|")
		if strings.HasSuffix(status, " installed") {
			have = v
		}
	}
	if have != b.Version {
		p.Changes = append(p.Changes, fmt.Sprintf("install %s %s (installed: %s)", b.Package, b.Version, or(have, "none")))
		d.install = true
	} else if mod, err := sys.ReadFile("/sys/module/nvidia/version"); err == nil && strings.TrimSpace(string(mod)) != upstream(b.Version) {
		p.Conditions = append(p.Conditions, Condition{RebootRequired,
			fmt.Sprintf("nvidia-driver: the loaded kernel module is %s, the installed driver %s (the next boot loads it)", strings.TrimSpace(string(mod)), upstream(b.Version))})
	}
	p.Detail = d
	return p, nil
}

func (n NvidiaDriver) Apply(ctx context.Context, sys System, body json.RawMessage, p Plan) error {
	d, ok := p.Detail.(driverPlan)
	if !ok {
		return fmt.Errorf("nvidia-driver: no plan")
	}
	b, err := n.decode(body)
	if err != nil {
		return err
	}
	if err := putFile(sys, NvidiaPinFile, d.pin); err != nil {
		return err
	}
	if !d.install {
		return nil
	}
	if err := aptGet(ctx, sys, "update"); err != nil {
		return err
	}
	return aptGet(ctx, sys, "install", "-y", "--allow-downgrades", "-o", "Dpkg::Options::=--force-confold", b.Package+"="+b.Version)
}

// AptUnit is the transient service apt-get runs in under systemd.
const AptUnit = "bcd-host-nvidia-driver.service"

// aptGet runs apt-get. Under systemd it runs as a transient service of
// its own (systemd-run --wait), outside the confinement of whoever asks:
// bcd helper's service has no CAP_SETUID or CAP_SETGID (apt drops to its
// _apt account to download: "setgroups 65534 failed"), no AF_INET (an
// http source) and no CAP_SYS_MODULE (a driver package's scripts), and
// dpkg cut off half-way when a caller's deadline passes would leave the
// package half-installed; the service runs on, the unit's fixed name
// keeps a second apt-get from starting beside it, and its output is in
// its journal. Without systemd apt-get runs directly.
func aptGet(ctx context.Context, sys System, args ...string) error {
	if !sys.Exists("/run/systemd/system") || !sys.Has("systemd-run") {
		_, err := sys.Run(ctx, "apt-get", args...)
		return err
	}
	run := append([]string{"--quiet", "--wait", "--collect", "--service-type=exec", "--unit=" + AptUnit,
		"--description=bcd host unit nvidia-driver: apt-get " + args[0],
		"--setenv=DEBIAN_FRONTEND=noninteractive", "--setenv=LC_ALL=C", "--", "apt-get"}, args...)
	if _, err := sys.Run(ctx, "systemd-run", run...); err != nil {
		return fmt.Errorf("apt-get %s in %s (its output: journalctl -u %s): %w", args[0], AptUnit, AptUnit, err)
	}
	return nil
}

func or(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
