// Command ramdisk-init is the uinit of the bcd ramdisk image: u-root's init
// sets up the root file system and runs it; it loads the image's kernel
// modules and starts `bcd ramdisk` (see initramfs/rdinit).
package main

import (
	"fmt"
	"os"

	"github.com/better-compute/bcd/initramfs/rdinit"
)

func main() {
	if err := rdinit.Run(rdinit.DefaultConfig()); err != nil {
		fmt.Fprintf(os.Stderr, "%s%v\n", rdinit.Prefix, err)
		os.Exit(1)
	}
}
