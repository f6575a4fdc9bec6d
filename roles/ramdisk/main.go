// Command bcd-ramdisk is the ramdisk role, started by the init of the PXE
// initramfs: it joins with the discovery attestor from the bc.* boot
// parameters and runs the ramdisk agent with disk.wipe and deploy.image
// (boot.kexec and diag.dcgm are wired here when they land).
package main

import (
	"log/slog"

	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/dcgm"
	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/ramdiskcmd"
	"github.com/better-compute/bcd/components/ramdiskkinds"
	"github.com/better-compute/bcd/components/roles"
	"github.com/better-compute/bcd/components/status"
)

func main() {
	roles.Main("ramdisk", []cli.Command{
		ramdiskcmd.Command(func(cacheURL string, log *slog.Logger) []dispatch.Kind {
			return append(ramdiskkinds.Kinds(ramdiskkinds.Config{CacheURL: cacheURL, Log: log.With("component", "ramdiskkinds")}), dcgm.Kind(""))
		}),
		status.Command(),
	}, nil)
}
