// Command ramdisk produces the bcd ramdisk boot artifacts in one directory
// (`make image`: images/out/): vmlinuz, Debian's kernel from the installed
// linux-image-amd64; initramfs.cpio.zst, built by package initramfs for
// that kernel's release; ramdisk.ipxe, the iPXE script that boots them
// with the site's bc.* parameters; and a SHA-256 digest file of each
// (<name>.sha256, in sha256sum's format). With -os (the default) it also
// builds os.img.zst, the test installed OS (images/osimage).
//
//	go run ./images/ramdisk -out images/out
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/images/osimage"
	"github.com/better-compute/bcd/initramfs"
)

// IPXEScript boots the ramdisk. ${bc-params} is the placeholder for the
// bc.* words (docs/bootparams.md): the boot server sets it before it
// chains this script, or renders its own copy with the words in place.
// initrd= names the initramfs for EFI boots, where iPXE does not pass it
// by address.
const IPXEScript = `#!ipxe
# bcd ramdisk (kernel %s). ${bc-params} holds the site's bc.* boot
# parameters; the kernel and initramfs are fetched relative to this script.
kernel vmlinuz initrd=initramfs.cpio.zst console=tty0 console=ttyS0,115200n8 panic=-1 ${bc-params}
initrd initramfs.cpio.zst
boot
`

func main() {
	var cfg initramfs.Config
	out := flag.String("out", "images/out", "output directory")
	boot := flag.String("boot", "/boot", "where the installed kernels are")
	modules := flag.String("modules", strings.Join(initramfs.DefaultModules, ","), "modules the ramdisk loads at every boot, comma-separated")
	drivers := flag.String("drivers", strings.Join(initramfs.DriverNames(initramfs.DefaultDrivers), ","), "hardware drivers the ramdisk carries and loads for the devices it finds, comma-separated")
	noCache := flag.Bool("no-cache", false, "rebuild the initramfs base layer (u-root init)")
	withOS := flag.Bool("os", true, "also build os.img.zst, the test installed OS the QEMU tests deploy (images/osimage)")
	cache, _ := os.UserCacheDir()
	flag.StringVar(&cfg.Repo, "repo", ".", "the bcd repository root")
	flag.StringVar(&cfg.KernelRelease, "kernel-release", "", "kernel release (default: the newest /boot/vmlinuz-* with /lib/modules)")
	flag.StringVar(&cfg.ModulesRoot, "modules-root", "/lib/modules", "where the kernels' module trees are")
	flag.StringVar(&cfg.BCD, "bcd", "", "a built ramdisk role binary (default: build ./roles/ramdisk with -ldflags)")
	flag.StringVar(&cfg.LDFlags, "ldflags", "-s -w", "linker flags for the role binary (make image passes the Makefile's, with version and commit)")
	flag.StringVar(&cfg.CABundle, "ca-bundle", "", "CA certificates (PEM) for deploy.image's https sources (default "+initramfs.DefaultCABundle+"; - for none)")
	flag.StringVar(&cfg.CacheDir, "cache", filepath.Join(cache, "bcd-ramdisk"), "where initramfs base layers are cached")
	flag.Parse()
	if flag.NArg() > 0 {
		fail(fmt.Errorf("takes no positional arguments"))
	}
	if *noCache {
		cfg.CacheDir = ""
	}
	cfg.Modules = strings.Split(*modules, ",")
	cfg.Drivers = strings.Split(*drivers, ",")
	cfg.Log = os.Stderr
	if cfg.KernelRelease == "" {
		rel, err := initramfs.KernelRelease(*boot, cfg.ModulesRoot)
		if err != nil {
			fail(err)
		}
		cfg.KernelRelease = rel
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	cfg.Output = filepath.Join(*out, "initramfs.cpio.zst")
	res, err := initramfs.Build(context.Background(), cfg)
	if err != nil {
		fail(err)
	}
	if err := copyFile(filepath.Join(*boot, "vmlinuz-"+cfg.KernelRelease), filepath.Join(*out, "vmlinuz")); err != nil {
		fail(err)
	}
	ipxe := fmt.Sprintf(IPXEScript, cfg.KernelRelease)
	if err := os.WriteFile(filepath.Join(*out, "ramdisk.ipxe"), []byte(ipxe), 0o644); err != nil {
		fail(err)
	}
	for _, name := range []string{"vmlinuz", "initramfs.cpio.zst", "ramdisk.ipxe"} {
		sum, size, err := digest(filepath.Join(*out, name))
		if err != nil {
			fail(err)
		}
		line := sum + "  " + name + "\n"
		if err := os.WriteFile(filepath.Join(*out, name+".sha256"), []byte(line), 0o644); err != nil {
			fail(err)
		}
		fmt.Printf("%-20s %10d bytes  sha256 %s\n", name, size, sum)
	}
	fmt.Printf("initramfs: cpio %d bytes: bin/init %d, bin/ramdisk-init %d, bin/bcd %d, %d modules %d, %d firmware files %d (%d drivers miss theirs); base layer cached: %v; built in %.1fs\n",
		res.CPIOSize, res.Sizes["bin/init"], res.Sizes["bin/ramdisk-init"], res.Sizes["bin/bcd"],
		len(res.Plan.Modules), res.Sizes["lib/modules"], len(res.Firmware), res.Sizes["lib/firmware"], len(res.FirmwareMissing),
		res.BaseCached, res.Took.Seconds())

	if !*withOS {
		return
	}
	// The test installed OS: the same kernel, an initramfs with the node
	// role and initramfs/osinit, in an ext4 partition of a disk image.
	osCfg := cfg
	osCfg.RolePackage, osCfg.InitPackage = "./roles/node", "./initramfs/cmd/os-init"
	osCfg.BCD = ""
	osCfg.Drivers = initramfs.VMDrivers
	osCfg.Output = filepath.Join(*out, "os-initramfs.cpio.zst")
	osRes, err := initramfs.Build(context.Background(), osCfg)
	if err != nil {
		fail(err)
	}
	img, err := osimage.Build(context.Background(), osimage.Config{Kernel: filepath.Join(*out, "vmlinuz"), Initramfs: osCfg.Output,
		Output: filepath.Join(*out, "os.img.zst")})
	if err != nil {
		fail(err)
	}
	fmt.Printf("%-20s %10d bytes  sha256 %s (disk %d bytes; initramfs %d bytes with the node role)\n", "os.img.zst", img.Size, img.SHA256, img.RawSize, osRes.Size)
}

func digest(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

// copyFile copies src to dst through a temporary file renamed into place.
func copyFile(src, dst string) error {
	if err := initramfs.CopyFile(src, dst+".tmp", 0o644); err != nil {
		return err
	}
	return os.Rename(dst+".tmp", dst)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "images/ramdisk:", err)
	os.Exit(1)
}
