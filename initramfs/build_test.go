package initramfs

import (
	"context"
	"errors"
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/u-root/mkuimage/cpio"
)

func TestCompareVersions(t *testing.T) {
	in := []string{"6.1.0-10-amd64", "6.1.0-9-amd64", "6.10.0-1-amd64", "5.10.0-30-amd64", "6.1.0-56-amd64"}
	slices.SortFunc(in, compareVersions)
	want := []string{"5.10.0-30-amd64", "6.1.0-9-amd64", "6.1.0-10-amd64", "6.1.0-56-amd64", "6.10.0-1-amd64"}
	if !slices.Equal(in, want) {
		t.Errorf("sorted %v, want %v", in, want)
	}
}

func TestKernelRelease(t *testing.T) {
	boot, mods := t.TempDir(), t.TempDir()
	for _, rel := range []string{"6.1.0-9-amd64", "6.1.0-10-amd64", "6.2.0-1-amd64"} {
		os.WriteFile(filepath.Join(boot, "vmlinuz-"+rel), nil, 0o644)
	}
	// 6.2.0-1 has no modules: not a candidate.
	for _, rel := range []string{"6.1.0-9-amd64", "6.1.0-10-amd64"} {
		os.MkdirAll(filepath.Join(mods, rel), 0o755)
		os.WriteFile(filepath.Join(mods, rel, "modules.dep"), nil, 0o644)
	}
	if rel, err := KernelRelease(boot, mods); err != nil || rel != "6.1.0-10-amd64" {
		t.Errorf("KernelRelease = %q, %v", rel, err)
	}
	if _, err := KernelRelease(t.TempDir(), mods); err == nil || !strings.Contains(err.Error(), "apt-get install linux-image-amd64") {
		t.Errorf("no kernel: %v", err)
	}
}

// fakeModules is a modules tree with a chain and an unrelated module.
func fakeModules(t *testing.T) (root, rel string) {
	root, rel = t.TempDir(), "6.1.0-test"
	dir := filepath.Join(root, rel)
	files := map[string]string{
		"modules.dep":       "kernel/a/core.ko:\nkernel/a/drv.ko: kernel/a/core.ko\nkernel/b/other.ko:\n",
		"modules.builtin":   "kernel/x/tpm_tis.ko\n",
		"kernel/a/core.ko":  "core",
		"kernel/a/drv.ko":   "drv",
		"kernel/b/other.ko": "other",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, rel
}

func TestStageModules(t *testing.T) {
	root, rel := fakeModules(t)
	stage := t.TempDir()
	plan, n, err := stageModules(Config{ModulesRoot: root, KernelRelease: rel, Modules: []string{"drv", "tpm_tis"}}, stage)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(plan.Names(), []string{"core", "drv"}) || !slices.Equal(plan.Builtin, []string{"tpm_tis"}) || n != 7 {
		t.Errorf("plan %v builtin %v, %d bytes", plan.Names(), plan.Builtin, n)
	}
	dst := filepath.Join(stage, "lib/modules", rel)
	if _, err := os.Stat(filepath.Join(dst, "kernel/b/other.ko")); err == nil {
		t.Error("a module nobody asked for was copied")
	}
	dep, _ := os.ReadFile(filepath.Join(dst, "modules.dep"))
	if string(dep) != "kernel/a/core.ko:\nkernel/a/drv.ko: kernel/a/core.ko\n" {
		t.Errorf("modules.dep:\n%s", dep)
	}
	list, _ := os.ReadFile(filepath.Join(stage, "etc/bcd-ramdisk/modules"))
	if !strings.HasSuffix(string(list), "\ndrv\ntpm_tis\n") {
		t.Errorf("module list:\n%s", list)
	}
	// Drivers are carried beside the modules and listed apart.
	stage = t.TempDir()
	if _, _, err := stageModules(Config{ModulesRoot: root, KernelRelease: rel, Modules: []string{"drv"}, Drivers: []string{"other"}}, stage); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(stage, "lib/modules", rel, "kernel/b/other.ko")); err != nil {
		t.Errorf("the driver's module: %v", err)
	}
	if list, _ := os.ReadFile(filepath.Join(stage, "etc/bcd-ramdisk/drivers")); !strings.HasSuffix(string(list), "\nother\n") {
		t.Errorf("driver list:\n%s", list)
	}
	if _, _, err := stageModules(Config{ModulesRoot: root, KernelRelease: rel, Modules: []string{"nosuch"}}, t.TempDir()); err == nil {
		t.Error("an unknown module was accepted")
	}
}

// TestBuild builds an image against a fake modules tree with a stand-in
// role binary and checks its records. The first run on a machine builds
// u-root's init (about 15 s); later runs take it from the cache.
func TestBuild(t *testing.T) {
	if testing.Short() {
		testenv.NotApplicable(t, "-short: it builds u-root's init")
	}
	root, rel := fakeModules(t)
	bcd := filepath.Join(t.TempDir(), "bcd")
	os.WriteFile(bcd, []byte("#!/bin/sh\n"), 0o755)
	cache, _ := os.UserCacheDir()
	out := filepath.Join(t.TempDir(), "initramfs.cpio.zst")
	bundle := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(bundle, []byte("a CA bundle\n"), 0o600)
	res, err := Build(context.Background(), Config{
		Repo: "..", KernelRelease: rel, ModulesRoot: root, Modules: []string{"drv"}, Drivers: []string{},
		BCD: bcd, Output: out, CacheDir: filepath.Join(cache, "bcd-ramdisk"), CABundle: bundle,
	})
	if errors.Is(err, ErrGoModLacksInit) {
		testenv.Skip(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	recs, err := ListArchive(out)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]cpio.Record{}
	for _, r := range recs {
		byName[r.Name] = r
	}
	link := func(name string) string {
		r, ok := byName[name]
		if !ok || r.Mode&cpio.S_IFMT != cpio.S_IFLNK {
			return ""
		}
		b := make([]byte, r.FileSize)
		r.ReadAt(b, 0)
		return string(b)
	}
	if got := link("init"); got != "bin/init" {
		t.Errorf("init -> %q", got)
	}
	if got := link("bin/uinit"); got != "ramdisk-init" {
		t.Errorf("bin/uinit -> %q", got)
	}
	for _, name := range []string{"bin/init", "bin/ramdisk-init", "bin/bcd", "dev/console", "etc/bcd-ramdisk/modules", "etc/bcd-ramdisk/drivers",
		"lib/modules/" + rel + "/kernel/a/drv.ko", "lib/modules/" + rel + "/kernel/a/core.ko", "lib/modules/" + rel + "/modules.dep"} {
		if _, ok := byName[name]; !ok {
			t.Errorf("the archive lacks %s", name)
		}
	}
	for _, name := range []string{"lib/modules/" + rel + "/kernel/b/other.ko", "etc/resolv.conf", "bin/sh"} {
		if _, ok := byName[name]; ok {
			t.Errorf("the archive has %s", name)
		}
	}
	// The CA bundle, where Go looks for it, readable by all.
	if r, ok := byName["etc/ssl/certs/ca-certificates.crt"]; !ok || r.Mode&0o777 != 0o644 || r.FileSize != uint64(len("a CA bundle\n")) {
		t.Errorf("the CA bundle in the archive: %v %v", ok, r.Info)
	}
	if r := byName["."]; r.Mode&0o777 != 0o755 {
		t.Errorf("the root is mode %#o, want 0755", r.Mode&0o777)
	}
	if r := byName["dev/console"]; r.Mode&cpio.S_IFMT != cpio.S_IFCHR || r.Rmajor != 5 || r.Rminor != 1 {
		t.Errorf("dev/console: %v", r.Info)
	}
	if res.Size == 0 || res.CPIOSize <= res.Size || res.Sizes["bin/init"] == 0 {
		t.Errorf("result %+v", res)
	}
	t.Logf("%d bytes (cpio %d), base cached %v, %v", res.Size, res.CPIOSize, res.BaseCached, res.Took)
}
