package instances

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/vm/seed"
)

// TestSeedInterfaces: the seed's network-config takes each NIC that has
// addresses; an EGRESS NIC's default routes go through the host's
// addresses on its bridge in its subnets, never for PRIVATE or NONE.
func TestSeedInterfaces(t *testing.T) {
	host := func(bridge string) []netip.Prefix {
		if bridge != "br0" {
			return nil
		}
		return []netip.Prefix{netip.MustParsePrefix("10.9.0.1/24"), netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("fd09::1/64"), netip.MustParsePrefix("fe80::1/64")}
	}
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	for _, tt := range []struct {
		name string
		nics []netpolicy.NIC
		want []seed.Interface
	}{
		{"none", nil, nil},
		{"EGRESS on br0, dual stack", []netpolicy.NIC{{Bridge: "br0", MAC: "52:54:00:00:00:01", Addresses: []string{"10.9.0.5/24", "fd09::5/64"}, Policy: netpolicy.Egress}},
			[]seed.Interface{{MAC: "52:54:00:00:00:01", Addresses: []netip.Prefix{p("10.9.0.5/24"), p("fd09::5/64")}, Gateways: []netip.Addr{a("10.9.0.1"), a("fd09::1")}}}},
		{"EGRESS in two IPv4 subnets: one default route", []netpolicy.NIC{{Bridge: "br0", MAC: "52:54:00:00:00:01", Addresses: []string{"10.9.0.5/24", "192.0.2.5/24"}, Policy: netpolicy.Egress}},
			[]seed.Interface{{MAC: "52:54:00:00:00:01", Addresses: []netip.Prefix{p("10.9.0.5/24"), p("192.0.2.5/24")}, Gateways: []netip.Addr{a("10.9.0.1")}}}},
		{"EGRESS on a bridge without addresses", []netpolicy.NIC{{Bridge: "br1", MAC: "52:54:00:00:00:01", Addresses: []string{"10.9.0.5/24"}, Policy: netpolicy.Egress}},
			[]seed.Interface{{MAC: "52:54:00:00:00:01", Addresses: []netip.Prefix{p("10.9.0.5/24")}}}},
		{"PRIVATE and NONE: no default route; no addresses: left out", []netpolicy.NIC{
			{Bridge: "br0", MAC: "52:54:00:00:00:01", Addresses: []string{"10.9.0.5/24"}, Policy: netpolicy.Private},
			{Bridge: "br0", MAC: "52:54:00:00:00:02", Policy: netpolicy.Egress},
			{Bridge: "br0", MAC: "52:54:00:00:00:03", Addresses: []string{"fd09::7/64"}, Policy: netpolicy.None}},
			[]seed.Interface{{MAC: "52:54:00:00:00:01", Addresses: []netip.Prefix{p("10.9.0.5/24")}}, {MAC: "52:54:00:00:00:03", Addresses: []netip.Prefix{p("fd09::7/64")}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := seedInterfaces(tt.nics, host)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("seedInterfaces = %+v, want %+v", got, tt.want)
			}
			if len(got) > 0 {
				if _, err := seed.NetworkConfig(got); err != nil {
					t.Errorf("the seed refuses them: %v", err)
				}
			}
		})
	}
	if _, err := seedInterfaces([]netpolicy.NIC{{Bridge: "br0", MAC: "52:54:00:00:00:01", Addresses: []string{"10.9.0.0/24"}, Policy: netpolicy.Egress}}, host); err == nil {
		t.Error("a subnet's network address was taken")
	}
}
