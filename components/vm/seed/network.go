package seed

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/helper/netpolicy"
)

// Bounds of network-config: the instances section's.
const (
	MaxInterfaces = netpolicy.MaxNICs
	MaxAddresses  = netpolicy.MaxAddresses
)

// Interface is one NIC of the instance, as network-config sets it up.
type Interface struct {
	// MAC matches the NIC: a unicast address in lower-case hex pairs.
	MAC string
	// Addresses are its IPAM addresses with their subnet's prefix length
	// (10.9.0.5/24, fd09::5/64), unicast, at least one.
	Addresses []netip.Prefix
	// Gateways (optional) are the default routes' next hops, at most one
	// per family, each inside one of Addresses' subnets.
	Gateways []netip.Addr
}

// NetworkConfig renders cloud-init's network-config (version 2) for
// nics: each matched by its MAC and named eth0, eth1, ... in order
// (cloud-init names the NIC with that MAC so), its static addresses, DHCP
// off, a default route through each gateway (gateway4 and gateway6:
// cloud-init 22.4, Debian 12's, renders a route to ::/0 as one to the
// address's own prefix, and knows no "default"). It refuses what it
// cannot express rather than render a guess. Every value is rendered
// from a checked typed value, so nothing in it is YAML of anyone's.
func NetworkConfig(nics []Interface) ([]byte, error) {
	if len(nics) == 0 || len(nics) > MaxInterfaces {
		return nil, fmt.Errorf("seed: network config of %d interfaces; 1 to %d", len(nics), MaxInterfaces)
	}
	var b strings.Builder
	b.WriteString("version: 2\nethernets:\n")
	macs := map[string]bool{}
	addrs := map[netip.Addr]bool{}
	for i, n := range nics {
		if !netpolicy.ValidMAC(n.MAC) {
			return nil, fmt.Errorf("seed: interface %d: MAC %q is not a unicast address in lower-case hex pairs", i, n.MAC)
		}
		if macs[n.MAC] {
			return nil, fmt.Errorf("seed: interface %d: MAC %s is another interface's", i, n.MAC)
		}
		macs[n.MAC] = true
		if len(n.Addresses) == 0 || len(n.Addresses) > MaxAddresses {
			return nil, fmt.Errorf("seed: interface %d has %d addresses; 1 to %d", i, len(n.Addresses), MaxAddresses)
		}
		fmt.Fprintf(&b, "  eth%d:\n    match:\n      macaddress: %s\n    dhcp4: false\n    dhcp6: false\n    addresses:\n", i, strconv.Quote(n.MAC))
		for _, p := range n.Addresses {
			if err := checkAddress(p); err != nil {
				return nil, fmt.Errorf("seed: interface %d: %w", i, err)
			}
			if addrs[p.Addr()] {
				return nil, fmt.Errorf("seed: interface %d: address %s is there twice", i, p.Addr())
			}
			addrs[p.Addr()] = true
			fmt.Fprintf(&b, "      - %s\n", strconv.Quote(p.String()))
		}
		families := map[bool]bool{}
		for _, g := range n.Gateways {
			if err := checkGateway(g, n.Addresses); err != nil {
				return nil, fmt.Errorf("seed: interface %d: %w", i, err)
			}
			if families[g.Is4()] {
				return nil, fmt.Errorf("seed: interface %d: a second IPv%s gateway %s (one default route per family)", i, family(g), g)
			}
			families[g.Is4()] = true
			fmt.Fprintf(&b, "    gateway%s: %s\n", family(g), strconv.Quote(g.String()))
		}
	}
	return []byte(b.String()), nil
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "4"
	}
	return "6"
}

// checkAddress: an IPAM address as the instances section takes it
// (netpolicy.ParseAddress): unicast, with its subnet's prefix length, not
// the subnet's network or broadcast address.
func checkAddress(p netip.Prefix) error {
	if !p.IsValid() {
		return errors.New("an address without its prefix length")
	}
	_, err := netpolicy.ParseAddress(p.String())
	return err
}

// checkGateway: g is inside one of addrs' subnets and none of them.
func checkGateway(g netip.Addr, addrs []netip.Prefix) error {
	if !g.IsValid() || g.Zone() != "" || g.Is4In6() || !g.IsGlobalUnicast() {
		return fmt.Errorf("gateway %s is not a unicast address", g)
	}
	for _, p := range addrs {
		if p.Addr() == g {
			return fmt.Errorf("gateway %s is the interface's own address", g)
		}
	}
	for _, p := range addrs {
		if p.Masked().Contains(g) {
			return nil
		}
	}
	return fmt.Errorf("gateway %s is in none of the interface's subnets", g)
}
