package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
)

// Nft checks, on a host with an instance runtime (virsh or
// cloud-hypervisor), that nft is installed: without it bcd helper cannot
// load the instances' network policy and tap guards, so no instance with
// a NIC runs, and the metadata service and instance dials stay off. A
// host without a runtime does not need it.
func Nft() Check { return nft("/") }

// systemDirs are where the tools are looked for: bcd helper finds nft in
// these only.
var systemDirs = []string{"usr/sbin", "sbin", "usr/bin", "bin"}

func nft(root string) Check {
	return Check{Name: "nft", Run: func(context.Context) Result {
		r := Result{Name: "nft", Status: OK}
		p := findIn(root, "nft")
		runtime := findIn(root, "virsh")
		if runtime == "" {
			runtime = findIn(root, "cloud-hypervisor")
		}
		switch {
		case p != "":
			r.Detail = p
		case runtime == "":
			r.Detail = "not installed; not needed: this host has no instance runtime"
		default:
			r.Status = Fail
			r.Detail = "not installed on a host with " + filepath.Base(runtime) + ": no anti-spoofing or network policies, so no instance with a NIC runs and the metadata service and instance dials stay off (apt-get install nftables)"
		}
		return r
	}}
}

// findIn is the path of an executable tool in root's system directories,
// "" when none has it.
func findIn(root, tool string) string {
	for _, d := range systemDirs {
		p := filepath.Join(root, d, tool)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return "/" + filepath.Join(d, tool)
		}
	}
	return ""
}

// VPS returns the instances' checks: the runtime, qemu-img and, under
// [helper] (helperUser not ""), that the node account is not in the
// libvirt group and that libvirt's QEMU driver runs with
// dynamic_ownership = 0 (docs/instances.md, "Through bcd helper").
func VPS(helperUser string) []Check {
	checks := []Check{vpsRuntime("/"), vpsTool("/", "qemu-img", "qemu-utils", "no instance disks can be made")}
	if helperUser != "" {
		checks = append(checks, libvirtGroup("/", helperUser), dynamicOwnership("/"))
	}
	return checks
}

// vpsRuntime: a runtime found (virsh and libvirtd), or a warning.
func vpsRuntime(root string) Check {
	return Check{Name: "instance-runtime", Run: func(context.Context) Result {
		r := Result{Name: "instance-runtime", Status: OK}
		virsh, libvirtd := findIn(root, "virsh"), findIn(root, "libvirtd")
		switch {
		case virsh != "" && libvirtd != "":
			r.Detail = "libvirt-kvm (" + virsh + ", " + libvirtd + ")"
		case virsh != "":
			r.Detail = "libvirt-kvm (" + virsh + "; libvirtd is not on this host, so root's [instances] libvirt_socket must name one)"
		default:
			r.Status = Warn
			r.Detail = "no instance runtime: an instances section naming any instance fails (apt-get install libvirt-daemon-system libvirt-clients qemu-system-x86)"
		}
		return r
	}}
}

// vpsTool: a tool the instances need, found in the system directories;
// missing is a warning on a host with a runtime, nothing without one.
func vpsTool(root, tool, pkg, without string) Check {
	return Check{Name: tool, Run: func(context.Context) Result {
		r := Result{Name: tool, Status: OK}
		p := findIn(root, tool)
		switch {
		case p != "":
			r.Detail = p
		case findIn(root, "virsh") == "":
			r.Detail = "not installed; not needed: this host has no instance runtime"
		default:
			r.Status = Warn
			r.Detail = "not installed: " + without + " (apt-get install " + pkg + ")"
		}
		return r
	}}
}

// libvirtGroup fails when the node account is in the libvirt group:
// libvirt's socket would then let it define any domain, around bcd
// helper's checks.
func libvirtGroup(root, user string) Check {
	return Check{Name: "libvirt-group", Run: func(context.Context) Result {
		r := Result{Name: "libvirt-group", Status: OK}
		b, err := os.ReadFile(filepath.Join(root, "etc/group"))
		if err != nil {
			r.Status, r.Detail = Warn, "cannot read /etc/group: "+err.Error()
			return r
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Split(line, ":")
			if len(f) != 4 || (f[0] != "libvirt" && f[0] != "libvirt-qemu") {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == user {
					r.Status = Fail
					r.Detail = user + " is in group " + f[0] + ": it reaches libvirtd around bcd helper's checks (gpasswd -d " + user + " " + f[0] + ")"
					return r
				}
			}
		}
		r.Detail = user + " is not in the libvirt group: domains only through bcd helper"
		return r
	}}
}

// dynamicOwnership warns unless /etc/libvirt/qemu.conf sets
// dynamic_ownership = 0: otherwise libvirt chowns what a domain names.
func dynamicOwnership(root string) Check {
	return Check{Name: "dynamic-ownership", Run: func(context.Context) Result {
		r := Result{Name: "dynamic-ownership", Status: Warn}
		b, err := os.ReadFile(filepath.Join(root, "etc/libvirt/qemu.conf"))
		if err != nil {
			r.Detail = "cannot read /etc/libvirt/qemu.conf: " + err.Error()
			return r
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, "=")
			if ok && strings.TrimSpace(k) == "dynamic_ownership" {
				if strings.TrimSpace(v) == "0" {
					r.Status, r.Detail = OK, "dynamic_ownership = 0"
					return r
				}
				r.Detail = "dynamic_ownership = " + strings.TrimSpace(v) + ": libvirt chowns the files a domain names; set it to 0 in /etc/libvirt/qemu.conf"
				return r
			}
		}
		r.Detail = "dynamic_ownership is not set (libvirt's default is 1: it chowns the files a domain names); set dynamic_ownership = 0 in /etc/libvirt/qemu.conf"
		return r
	}}
}
