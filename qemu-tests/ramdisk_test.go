package qemutests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRamdiskBoots boots the ramdisk with an empty virtio disk, an empty
// NVMe disk, a virtio and an e1000 NIC and a virtio RNG, and checks that
// the init loaded the modules, found the devices, printed the bc.* words,
// ran `bcd ramdisk` when the role has it (which refuses a command line
// with only bc.gateway, exit 2) and powered the VM off.
func TestRamdiskBoots(t *testing.T) {
	qemu, dir := prerequisites(t)
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initramfs.cpio.zst")
	st, err := os.Stat(initrd)
	if err != nil {
		t.Fatal(err)
	}
	// The budget of the compressed initramfs with the full driver set
	// (docs/ramdisk.md).
	if st.Size() > 12<<20 {
		t.Errorf("initramfs.cpio.zst is %d bytes, over the 12 MiB budget", st.Size())
	}
	vda, nvme := sparseDisk(t, "vda.img", 64<<20), sparseDisk(t, "nvme.img", 64<<20)
	b := runVM(t, qemu, kernel, initrd, "bcd-ramdisk: init started",
		"-drive", "file="+vda+",if=virtio,format=raw",
		"-drive", "file="+nvme+",if=none,id=nvm0,format=raw",
		"-device", "nvme,serial=bcdtest0,drive=nvm0",
		// NICs whose user-mode back ends reach nothing (restrict=on): the
		// test only checks that their drivers bind.
		"-nic", "none",
		"-netdev", "user,id=n0,restrict=on", "-device", "virtio-net-pci,netdev=n0",
		"-netdev", "user,id=n1,restrict=on", "-device", "e1000,netdev=n1",
		"-device", "virtio-rng-pci",
	)

	console := b.console()
	failed := false
	check := func(ok bool, format string, a ...any) {
		if !ok {
			failed = true
			t.Errorf(format, a...)
		}
	}
	for key := range marks {
		_, ok := b.seen[key]
		check(ok, "the console never showed %s (%q)", key, marks[key])
	}
	mods := " " + b.after("bcd-ramdisk: modules: ") + " "
	check(strings.Contains(mods, " sd_mod ") || strings.Contains(mods, " sd_mod;"), "module sd_mod (loaded at every boot) not loaded: modules:%s", mods)
	check(!strings.Contains(mods, "failed or skipped"), "a module failed: %s", mods)
	// The hardware drivers load for the devices this VM has, and only
	// those: none of the server NICs or RAID controllers it lacks.
	drivers := " " + b.after("bcd-ramdisk: drivers loaded for this machine: ") + " "
	for _, m := range []string{"virtio_pci", "virtio_blk", "virtio_net", "virtio_rng", "e1000", "nvme", "ahci"} {
		check(strings.Contains(drivers, " "+m+" "), "driver %s not loaded: drivers loaded:%s", m, drivers)
	}
	for _, m := range []string{"mlx5_core", "megaraid_sas", "ice", "igb"} {
		check(!strings.Contains(b.console(), "driver "+m+" "), "driver %s loaded on a VM without its device", m)
	}
	blk := b.after("bcd-ramdisk: block devices: ")
	check(strings.Contains(blk, "vda (64 MiB)") && strings.Contains(blk, "nvme0n1 (64 MiB)"), "block devices: %q, want vda and nvme0n1", blk)
	nets := b.after("bcd-ramdisk: network interfaces: ")
	check(strings.Contains(nets, "(virtio_net)") && strings.Contains(nets, "(e1000)"), "network interfaces: %q", nets)
	want := []string{
		"bcd-ramdisk: boot parameters: 2 bc.* words\n",
		"bcd-ramdisk: bc.gateway=https://127.0.0.1:1\n",
		"bcd-ramdisk: bc.test=1\n",
		"bcd-ramdisk: powering off\n",
	}
	agent := strings.Contains(console, "bcd-ramdisk: starting /bin/bcd ramdisk")
	if agent {
		// The role has the agent: with only these two words it refuses
		// the command line (a missing parameter exits 2).
		want = append(want, "bcd-ramdisk: /bin/bcd ramdisk exited with status 2\n")
		t.Logf("bcd ramdisk said: %q", b.after("bcd ramdisk: "))
	} else {
		want = append(want, "bcd-ramdisk: ramdisk agent not built yet\n", "bcd-ramdisk: bcd ")
	}
	for _, w := range want {
		check(strings.Contains(console, w), "console lacks %q", w)
	}
	if failed {
		b.dump(t)
	}
	t.Logf("QEMU start -> kernel runs /init %.1fs -> u-root init %.1fs -> bcd-ramdisk init %.1fs -> power off %.1fs (accel %s)",
		b.seen["kernel init"].Seconds(), b.seen["u-root"].Seconds(), b.seen["init"].Seconds(), b.seen["poweroff"].Seconds(), b.accel)
	t.Logf("initramfs.cpio.zst: %d bytes (%.1f MiB); modules:%s", st.Size(), float64(st.Size())/(1<<20), strings.TrimRight(mods, " "))
}
