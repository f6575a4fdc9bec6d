package instances

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/vm/seed"
)

// seedInterfaces gives the seed's network-config the instance's NICs
// that have addresses, so the guest takes them at first boot: each
// matched by its MAC, with its static addresses. An EGRESS NIC routes by
// default through the host's address on its bridge in each of its
// subnets, where hostAddrs finds one (PRIVATE and NONE reach only their
// subnets and the host, so they get no default route). A NIC without
// addresses is left out: bcd knows nothing to give it.
func seedInterfaces(nics []netpolicy.NIC, hostAddrs func(bridge string) []netip.Prefix) ([]seed.Interface, error) {
	var out []seed.Interface
	for i, n := range nics {
		if len(n.Addresses) == 0 {
			continue
		}
		in := seed.Interface{MAC: n.MAC}
		var host []netip.Prefix
		if n.Policy == netpolicy.Egress {
			host = hostAddrs(n.Bridge)
		}
		gw := map[bool]bool{}
		for _, a := range n.Addresses {
			p, err := netpolicy.ParseAddress(a)
			if err != nil {
				return nil, fmt.Errorf("NIC %d: %w", i, err)
			}
			in.Addresses = append(in.Addresses, p)
			for _, h := range host {
				if !gw[h.Addr().Is4()] && h.Addr() != p.Addr() && p.Masked().Contains(h.Addr()) {
					in.Gateways = append(in.Gateways, h.Addr())
					gw[h.Addr().Is4()] = true
				}
			}
		}
		out = append(out, in)
	}
	return out, nil
}

// bridgeAddrs lists the addresses of the host's interface name (none
// when it has none or there is no such interface: a fakehw machine).
func bridgeAddrs(name string) []netip.Prefix {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil
	}
	as, err := ifi.Addrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ones, _ := n.Mask.Size()
				out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
			}
		}
	}
	return out
}
