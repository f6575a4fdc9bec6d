// Command os-init is the uinit of the test installed OS (initramfs/osinit):
// u-root's init runs it; it loads the image's modules, configures the
// network, mounts the OS's root partition and runs `bcd join` (--node-id,
// or --attestor tpm when etc/bcd/attestor says so) then `bcd node`.
package main

import (
	"fmt"
	"os"

	"github.com/better-compute/bcd/initramfs/osinit"
	"github.com/better-compute/bcd/initramfs/rdinit"
)

func main() {
	c := rdinit.DefaultConfig()
	c.Prefix = osinit.Prefix
	c.HasAgent = func(string) bool { return true }
	c.Prepare = func(printf func(string, ...any)) error {
		b, err := os.ReadFile("/proc/cmdline")
		if err != nil {
			return err
		}
		return osinit.MountRoot(osinit.RootDevice(string(b)), printf)
	}
	c.Steps = func() ([][]string, error) { return osinit.Steps("/etc/bcd") }
	if err := rdinit.Run(c); err != nil {
		fmt.Fprintf(os.Stderr, "%s%v\n", osinit.Prefix, err)
		os.Exit(1)
	}
}
