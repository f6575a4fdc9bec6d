// Package qemutests boots the bcd ramdisk in QEMU under TCG (KVM is
// detected, never required) and checks what its console says. It is run by
// `make qemu-test` (go test ./qemu-tests/), not by `make test`.
//
// Without qemu-system-x86_64 or an installed Debian kernel the tests skip
// with the reason, and fail under CI=true. The image comes from
// $BCD_RAMDISK_DIR when set, else images/out when it is newer than the
// sources, else it is built into images/out (go run ./images/ramdisk).
package qemutests
