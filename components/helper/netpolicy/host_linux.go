//go:build linux

package netpolicy

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"
)

// ReadHost reads what the renderer trusts about this host from the host
// itself: each named bridge that exists and is a bridge, with its MAC and
// every address it holds, and whether the host is an EC2 instance. A name
// that is no bridge is left out (Plan fails its NICs). sys is /sys.
func ReadHost(sys string, bridges []string) (Host, error) {
	h := Host{Bridges: map[string]Bridge{}, EC2: IsEC2(sys)}
	for _, name := range bridges {
		if !ifname(name) {
			continue
		}
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			continue
		}
		if kind, err := linkKind(ifi.Index); err != nil {
			return Host{}, err
		} else if kind != "bridge" {
			continue
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			return Host{}, fmt.Errorf("reading bridge %s's addresses: %w", name, err)
		}
		b := Bridge{MAC: ifi.HardwareAddr.String()}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					b.Addrs = append(b.Addrs, ip.Unmap())
				}
			}
		}
		h.Bridges[name] = b
	}
	return h, nil
}

// linkKind is the kind of link index (IFLA_INFO_KIND: "bridge", "veth",
// "" for a plain device), asked of the kernel over rtnetlink in the
// caller's network namespace.
func linkKind(index int) (string, error) {
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETLINK, syscall.AF_UNSPEC)
	if err != nil {
		return "", fmt.Errorf("listing links: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return "", fmt.Errorf("listing links: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != syscall.RTM_NEWLINK || len(m.Data) < syscall.SizeofIfInfomsg {
			continue
		}
		info := (*syscall.IfInfomsg)(unsafe.Pointer(&m.Data[0]))
		if int(info.Index) != index {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			return "", fmt.Errorf("reading link %d: %w", index, err)
		}
		for _, a := range attrs {
			if a.Attr.Type != syscall.IFLA_LINKINFO {
				continue
			}
			// Nested attributes: 2-byte length, 2-byte type, value, padded to 4.
			for b := a.Value; len(b) >= 4; {
				l := int(binary.NativeEndian.Uint16(b))
				if l < 4 || l > len(b) {
					break
				}
				if binary.NativeEndian.Uint16(b[2:]) == 1 { // IFLA_INFO_KIND
					return strings.TrimRight(string(b[4:l]), "\x00"), nil
				}
				b = b[min((l+3)&^3, len(b)):]
			}
		}
		return "", nil
	}
	return "", nil
}

// BridgeNames are the bridges the instances' NICs name, once each.
func BridgeNames(instances []Instance) []string {
	var out []string
	seen := map[string]bool{}
	for _, in := range instances {
		for _, n := range in.NICs {
			if !seen[n.Bridge] {
				seen[n.Bridge] = true
				out = append(out, n.Bridge)
			}
		}
	}
	return out
}

// IsEC2 reports whether the host is an EC2 instance, as its firmware
// (DMI vendor "Amazon EC2", a Nitro host) or Xen hypervisor UUID ("ec2...")
// says. sys is /sys.
func IsEC2(sys string) bool {
	for _, f := range []string{"class/dmi/id/sys_vendor", "class/dmi/id/board_vendor"} {
		b, err := os.ReadFile(filepath.Join(sys, f))
		if err == nil && strings.TrimSpace(string(b)) == "Amazon EC2" {
			return true
		}
	}
	b, err := os.ReadFile(filepath.Join(sys, "hypervisor/uuid"))
	return err == nil && strings.HasPrefix(strings.ToLower(strings.TrimSpace(string(b))), "ec2")
}
