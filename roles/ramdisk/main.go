// Command bcd-ramdisk is the ramdisk role, started by the init of the PXE
// initramfs: it joins with the discovery attestor from the bc.* boot
// parameters and runs the ramdisk agent with disk.wipe, deploy.image,
// boot.kexec and diag.dcgm.
package main

import (
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/roles"
	"github.com/better-compute/bcd/components/disk/ramdiskcmd"
	"github.com/better-compute/bcd/components/disk/ramdiskkinds"
	"github.com/better-compute/bcd/components/machine/dcgm"
)

func main() {
	roles.Main("ramdisk", []cli.Command{
		ramdiskcmd.Command(kinds),
		status.Command(),
	}, nil)
}

// kinds are the ramdisk's kinds (roles/ramdisk/kinds.txt).
func kinds(e ramdiskcmd.Env) []dispatch.Kind {
	return append(ramdiskkinds.Kinds(ramdiskkinds.Config{CacheURL: e.CacheURL, Log: e.Log.With("component", "ramdiskkinds"),
		OS: ramdiskkinds.OSFiles{ConfigTOML: e.OSConfig, JWK: e.OSJWK}}), dcgm.Kind(""))
}
