// Command vmwipe is the guest half of qemu-tests' TestWipeInVM: the test
// puts it in the ramdisk image as /bin/uinit. It loads the image's kernel
// modules like the ramdisk's init, runs every disk.wipe mode against the
// VM's virtio and NVMe disks with components/disk/wipe, prints each report as
// one "WIPE-REPORT {json}" line on the console, and powers off. The host
// half checks the reports and reads the disk files back.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/better-compute/bcd/components/disk/wipe"
	"github.com/better-compute/bcd/initramfs/rdinit"
	"golang.org/x/sys/unix"
)

// run is one wipe the host expects, in order.
type run struct {
	Name   string       `json:"name"`
	Device string       `json:"device"`
	Mode   wipe.Mode    `json:"mode"`
	Caps   *wipe.Caps   `json:"caps,omitempty"`
	Report *wipe.Report `json:"report"`
}

var runs = []run{
	{Name: "vda quick", Device: "/dev/vda", Mode: wipe.Quick},
	{Name: "vda secure-erase", Device: "/dev/vda", Mode: wipe.SecureErase},
	{Name: "vda crypto-erase", Device: "/dev/vda", Mode: wipe.CryptoErase},
	{Name: "nvme crypto-erase", Device: "/dev/nvme0n1", Mode: wipe.CryptoErase},
	{Name: "nvme secure-erase", Device: "/dev/nvme0n1", Mode: wipe.SecureErase},
	// QEMU accepts SES=2 without advertising it: the test-only override
	// exercises the crypto-erase command path.
	{Name: "nvme crypto-erase with the test override", Device: "/dev/nvme0n1", Mode: wipe.CryptoErase,
		Caps: &wipe.Caps{Model: "override", FormatNVM: true, CryptoEraseFormat: true}},
}

func main() {
	c := rdinit.DefaultConfig()
	c.Out = os.Stdout
	for _, err := range rdinit.MountMissing() {
		fmt.Println("vmwipe: mount:", err)
	}
	names := []string{"virtio_pci", "virtio_blk", "nvme"}
	rs, err := c.Load(names)
	fmt.Printf("vmwipe: loaded %d modules: %v\n", len(rs), err)
	for _, dev := range []string{"/dev/vda", "/dev/nvme0n1"} {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(dev); err == nil {
				break
			}
		}
	}
	for _, r := range runs {
		rep, err := wipe.Wipe(context.Background(), r.Device, wipe.Options{Mode: r.Mode, TestCaps: r.Caps})
		r.Report = &rep
		b, _ := json.Marshal(r)
		fmt.Printf("WIPE-REPORT %s\n", b)
		fmt.Printf("vmwipe: %s: %v\n", r.Name, err)
	}
	unix.Sync()
	fmt.Println("vmwipe: powering off")
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
