// Command bcx-ipmi is bcd's IPMI driver plugin ("ipmi"): power state and
// control, the boot device and inspection (FRU, BMC information, sensors,
// the system GUID) through ipmitool -I lanplus, the password handed over a
// pipe (-f /dev/fd/3), never on a command line or in the environment. bcd's
// plugin host (components/bcx) starts it; it is not a command for people.
package main

import (
	"fmt"
	"os"

	"github.com/better-compute/bcd/components/bcx"
)

func main() {
	if err := bcx.Serve(&driver{ipmitool: "ipmitool"}); err != nil {
		fmt.Fprintln(os.Stderr, "bcx-ipmi:", err)
		os.Exit(1)
	}
}
