package proxydhcp

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// socketControl sets the options a proxy DHCP socket needs before bind:
// SO_REUSEADDR and SO_REUSEPORT to share port 67 with the network's DHCP
// server (run as the same user), SO_BROADCAST to send broadcast offers,
// and SO_BINDTODEVICE to iface when one is named.
func socketControl(iface string) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var opErr error
		err := c.Control(func(fd uintptr) {
			for _, o := range []struct {
				name string
				opt  int
			}{
				{"SO_REUSEADDR", unix.SO_REUSEADDR},
				{"SO_REUSEPORT", unix.SO_REUSEPORT},
				{"SO_BROADCAST", unix.SO_BROADCAST},
			} {
				if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o.opt, 1); err != nil {
					opErr = fmt.Errorf("setsockopt(%s, %s, 1) = %w", address, o.name, err)
					return
				}
			}
			if iface != "" {
				if err := unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, iface); err != nil {
					opErr = fmt.Errorf("setsockopt(%s, SO_BINDTODEVICE, %q) = %w", address, iface, err)
				}
			}
		})
		if err != nil {
			return fmt.Errorf("setting socket options on %s: %w", address, err)
		}
		return opErr
	}
}
