// Package disk groups the ramdisk's work on a machine's disks: wipe
// (quick, secure-erase, crypto-erase), deploy (an image streamed through
// SHA-256 and decompression onto a disk), osinstall (configuring the OS
// just written), kmod (kernel modules for the initramfs), ramdiskkinds
// (disk.wipe, deploy.image, boot.kexec) and ramdiskcmd (`bcd ramdisk`,
// the ramdisk's agent mode, which reads its bc.* boot parameters).
//
// It may import base, trust, helper, agent, machine and boot (only the
// boot parameters' parser, never the boot server). The site role must not
// link it (roles/deps_test.go).
package disk
