package rdinit

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/disk/kmod"
)

func TestSplitCmdline(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"console=ttyS0 panic=-1\n", []string{"console=ttyS0", "panic=-1"}},
		{`  a="b c"   d  `, []string{"a=b c", "d"}},
		{`"quoted whole" x=""`, []string{"quoted whole", "x="}},
		{"bc.gateway=https://h:1\tbc.test=1", []string{"bc.gateway=https://h:1", "bc.test=1"}},
	} {
		if got := SplitCmdline(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("SplitCmdline(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestBootWords(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cmdline")
	os.WriteFile(p, []byte(`BOOT_IMAGE=/vmlinuz console=ttyS0 bc.gateway=https://127.0.0.1:1 bc.token=bcdt_secret123 bcx.no=1 bc.test=1 "bc.site=a b"`+"\n"), 0o644)
	got, err := BootWords(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"bc.gateway=https://127.0.0.1:1", "bc.token=<14 bytes, not shown>", "bc.test=1", "bc.site=a b"}
	if !slices.Equal(got, want) {
		t.Errorf("BootWords = %q, want %q", got, want)
	}
	if _, err := BootWords(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing command line is not an error")
	}
}

func TestHasRamdiskCommand(t *testing.T) {
	dir := t.TempDir()
	for name, script := range map[string]string{
		"with":    "#!/bin/sh\n[ \"$1 $2\" = 'ramdisk -h' ] && exit 0\nexit 3\n",
		"without": "#!/bin/sh\necho 'bcd ramdisk: the ramdisk agent has not landed in this build yet' >&2\nexit 2\n",
	} {
		os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755)
	}
	if !HasRamdiskCommand(filepath.Join(dir, "with")) {
		t.Error("with: false")
	}
	if HasRamdiskCommand(filepath.Join(dir, "without")) {
		t.Error("without: true")
	}
	if HasRamdiskCommand(filepath.Join(dir, "missing")) {
		t.Error("missing binary: true")
	}
}

// fakeMachine is a temp dir laid out like the image on a running kernel.
func fakeMachine(t *testing.T, bcd string) Config {
	dir := t.TempDir()
	files := map[string]string{
		"proc/cmdline":                   "console=ttyS0 bc.gateway=https://127.0.0.1:1 bc.test=1\n",
		"etc/bcd-ramdisk/modules":        "# the ramdisk's modules\nvirtio_blk\nnvme\n\n",
		"sys/class/block/vda/size":       "131072\n",
		"sys/class/block/nvme0n1/size":   "131072\n",
		"sys/class/block/vda1/partition": "1\n",
		"sys/class/block/loop0/size":     "0\n",
		"sys/class/net/lo/address":       "00:00:00:00:00:00\n",
		"devices/virtio1/driver/.keep":   "",
		"bin/bcd":                        bcd,
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(content), 0o755)
	}
	os.MkdirAll(filepath.Join(dir, "sys/class/net/eth0/device"), 0o755)
	os.Symlink(filepath.Join(dir, "devices/virtio1/driver"), filepath.Join(dir, "sys/class/net/eth0/device/driver"))
	return Config{
		Cmdline:     filepath.Join(dir, "proc/cmdline"),
		Release:     "6.1.0-test",
		ModulesList: filepath.Join(dir, "etc/bcd-ramdisk/modules"),
		SysBlock:    filepath.Join(dir, "sys/class/block"),
		SysNet:      filepath.Join(dir, "sys/class/net"),
		BCD:         filepath.Join(dir, "bin/bcd"),
		Settle:      200 * time.Millisecond,
		Quiet:       50 * time.Millisecond,
		HasAgent:    HasRamdiskCommand,
	}
}

const noAgent = "#!/bin/sh\n[ \"$1\" = version ] && { echo 'bcd 0.1.0-dev (ramdisk) linux/amd64'; exit 0; }\nexit 2\n"

func TestRunWithoutAgent(t *testing.T) {
	c := fakeMachine(t, noAgent)
	var out bytes.Buffer
	var loaded []string
	poweredOff := false
	c.Out = &out
	c.Load = func(names []string) ([]kmod.Result, error) {
		loaded = names
		return []kmod.Result{
			{Module: kmod.Module{Name: "virtio"}, State: kmod.Loaded},
			{Module: kmod.Module{Name: "virtio_blk"}, State: kmod.Loaded},
			{Module: kmod.Module{Name: "crct10dif_pclmul", Soft: true}, State: kmod.Failed, Err: syscall.ENODEV},
			{Module: kmod.Module{Name: "nvme"}, State: kmod.AlreadyLoaded},
		}, nil
	}
	c.RunAgent = func(string, []string) (int, error) { t.Fatal("ran an agent that is not there"); return 0, nil }
	c.PowerOff = func() error { poweredOff = true; return nil }
	if err := Run(c); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(loaded, []string{"virtio_blk", "nvme"}) {
		t.Errorf("loaded %v", loaded)
	}
	if !poweredOff {
		t.Error("did not power off")
	}
	for _, want := range []string{
		"bcd-ramdisk: init started (kernel 6.1.0-test)",
		"bcd-ramdisk: modules: loaded 2 in ",
		"virtio virtio_blk; already loaded: nvme; 1 failed or skipped",
		"bcd-ramdisk: module crct10dif_pclmul failed (softdep, not needed): no such device",
		"bcd-ramdisk: block devices: nvme0n1 (64 MiB) vda (64 MiB)\n",
		"bcd-ramdisk: network interfaces: eth0 (driver)\n",
		NotBuilt + "\n",
		"bcd-ramdisk: bcd 0.1.0-dev (ramdisk) linux/amd64\n",
		"bcd-ramdisk: bc.gateway=https://127.0.0.1:1\nbcd-ramdisk: bc.test=1\n",
		"bcd-ramdisk: powering off\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunRunsAgent(t *testing.T) {
	c := fakeMachine(t, "#!/bin/sh\nexit 0\n")
	var out bytes.Buffer
	c.Out = &out
	c.Load = func([]string) ([]kmod.Result, error) { return nil, errors.New("kmod: broken tree") }
	var argv []string
	c.RunAgent = func(bcd string, args []string) (int, error) { argv = append([]string{bcd}, args...); return 2, nil }
	poweredOff := false
	c.PowerOff = func() error { poweredOff = true; return syscall.EPERM }
	err := Run(c)
	if !errors.Is(err, syscall.EPERM) || !poweredOff {
		t.Fatalf("Run = %v, powered off %v", err, poweredOff)
	}
	if !slices.Equal(argv, []string{c.BCD, "ramdisk"}) {
		t.Errorf("ran %q", argv)
	}
	for _, want := range []string{
		"bcd-ramdisk: modules: kmod: broken tree\n",
		"bcd-ramdisk: bc.gateway=https://127.0.0.1:1\nbcd-ramdisk: bc.test=1\n",
		"bcd-ramdisk: starting " + c.BCD + " ramdisk (",
		"bcd-ramdisk: " + c.BCD + " ramdisk exited with status 2\nbcd-ramdisk: powering off\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), NotBuilt) {
		t.Error("said the agent is not built")
	}
}
