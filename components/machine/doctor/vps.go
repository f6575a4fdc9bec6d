package doctor

import (
	"context"
	"os"
	"path/filepath"
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
