//go:build !linux

package proxydhcp

import (
	"errors"
	"syscall"
)

// socketControl: the proxy DHCP server runs on Linux only (it needs
// SO_REUSEPORT beside the network's DHCP server and SO_BINDTODEVICE).
func socketControl(iface string) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		return errors.New("proxy DHCP needs Linux socket options")
	}
}
