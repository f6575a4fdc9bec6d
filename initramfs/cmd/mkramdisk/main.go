// Command mkramdisk builds the bcd ramdisk's initramfs.cpio.zst (see
// package initramfs). Run it from the repository root:
//
//	go run ./initramfs/cmd/mkramdisk -o images/out/initramfs.cpio.zst
//
// -list prints the records of a built archive instead.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/initramfs"
)

func main() {
	var cfg initramfs.Config
	var modules, list string
	var noCache, printRelease bool
	cache, _ := os.UserCacheDir()
	flag.StringVar(&cfg.Output, "o", "images/out/initramfs.cpio.zst", "the archive to write")
	flag.StringVar(&cfg.Repo, "repo", ".", "the bcd repository root")
	flag.StringVar(&cfg.KernelRelease, "kernel-release", "", "kernel release whose modules to copy (default: the newest /boot/vmlinuz-* with /lib/modules)")
	flag.StringVar(&cfg.ModulesRoot, "modules-root", "/lib/modules", "where the kernels' module trees are")
	flag.StringVar(&modules, "modules", strings.Join(initramfs.DefaultModules, ","), "modules to load at boot, comma-separated (dependencies are added)")
	flag.StringVar(&cfg.BCD, "bcd", "", "a built ramdisk role binary (default: build ./roles/ramdisk)")
	flag.StringVar(&cfg.LDFlags, "ldflags", "-s -w", "linker flags when building the role binary")
	flag.StringVar(&cfg.CacheDir, "cache", filepath.Join(cache, "bcd-ramdisk"), "where base layers are cached")
	flag.BoolVar(&noCache, "no-cache", false, "rebuild the base layer (u-root init) and do not cache it")
	flag.BoolVar(&printRelease, "print-kernel-release", false, "print the kernel release the build would use and exit")
	flag.StringVar(&list, "list", "", "print the records of this archive and exit")
	flag.Parse()
	if flag.NArg() > 0 {
		fail("takes no positional arguments")
	}
	if list != "" {
		recs, err := initramfs.ListArchive(list)
		if err != nil {
			fail(err.Error())
		}
		for _, r := range recs {
			fmt.Printf("%#o %10d %s\n", r.Mode, r.FileSize, r.Name)
		}
		return
	}
	if cfg.KernelRelease == "" {
		rel, err := initramfs.KernelRelease("/boot", cfg.ModulesRoot)
		if err != nil {
			fail(err.Error())
		}
		cfg.KernelRelease = rel
	}
	if printRelease {
		fmt.Println(cfg.KernelRelease)
		return
	}
	if noCache {
		cfg.CacheDir = ""
	}
	if modules != "" {
		cfg.Modules = strings.Split(modules, ",")
	} else {
		cfg.Modules = []string{}
	}
	cfg.Log = os.Stderr
	if _, err := initramfs.Build(context.Background(), cfg); err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "mkramdisk: "+msg)
	os.Exit(1)
}
