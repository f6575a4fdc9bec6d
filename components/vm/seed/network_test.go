package seed

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// TestNetworkConfig renders network-config for NICs and reads it back
// with a YAML parser: version 2, each NIC matched by its MAC, its
// static addresses, DHCP off, a default route per gateway.
func TestNetworkConfig(t *testing.T) {
	type eth struct {
		Match     map[string]string
		DHCP4     bool `yaml:"dhcp4"`
		DHCP6     bool `yaml:"dhcp6"`
		Addresses []string
		Gateway4  string `yaml:"gateway4"`
		Gateway6  string `yaml:"gateway6"`
	}
	type config struct {
		Version   int
		Ethernets map[string]eth
	}
	for _, tt := range []struct {
		name string
		nics []Interface
		want config
	}{
		{"one IPv4 address, no gateway", []Interface{{MAC: "52:54:00:0a:00:05", Addresses: prefixes("10.9.0.5/24")}},
			config{2, map[string]eth{"eth0": {Match: map[string]string{"macaddress": "52:54:00:0a:00:05"}, Addresses: []string{"10.9.0.5/24"}}}}},
		{"dual stack with gateways", []Interface{{MAC: "52:54:00:0a:00:05", Addresses: prefixes("10.9.0.5/24", "fd09::5/64"), Gateways: addrs("10.9.0.1", "fd09::1")}},
			config{2, map[string]eth{"eth0": {Match: map[string]string{"macaddress": "52:54:00:0a:00:05"}, Addresses: []string{"10.9.0.5/24", "fd09::5/64"},
				Gateway4: "10.9.0.1", Gateway6: "fd09::1"}}}},
		{"two NICs, a /32 and an IPv6 alone", []Interface{
			{MAC: "52:54:00:0a:00:05", Addresses: prefixes("192.0.2.7/32")},
			{MAC: "02:00:00:00:00:01", Addresses: prefixes("2001:db8::7/64"), Gateways: addrs("2001:db8::1")}},
			config{2, map[string]eth{
				"eth0": {Match: map[string]string{"macaddress": "52:54:00:0a:00:05"}, Addresses: []string{"192.0.2.7/32"}},
				"eth1": {Match: map[string]string{"macaddress": "02:00:00:00:00:01"}, Addresses: []string{"2001:db8::7/64"}, Gateway6: "2001:db8::1"}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NetworkConfig(tt.nics)
			if err != nil {
				t.Fatal(err)
			}
			var got config
			if err := yaml.Unmarshal(b, &got); err != nil {
				t.Fatalf("network-config does not parse: %v\n%s", err, b)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("network-config reads as %+v, want %+v\n%s", got, tt.want, b)
			}
			// DHCP is off by the document's own words, not by omission.
			if strings.Count(string(b), "dhcp4: false") != len(tt.nics) || strings.Count(string(b), "dhcp6: false") != len(tt.nics) {
				t.Errorf("DHCP not turned off on every NIC:\n%s", b)
			}
		})
	}
}

// TestNetworkConfigRefuses: what network-config cannot express is
// refused, with the reason.
func TestNetworkConfigRefuses(t *testing.T) {
	ok := Interface{MAC: "52:54:00:0a:00:05", Addresses: prefixes("10.9.0.5/24")}
	many := make([]Interface, MaxInterfaces+1)
	for i := range many {
		many[i] = Interface{MAC: "52:54:00:0a:00:" + string("0123456789"[i]) + "0", Addresses: prefixes("10.9." + string("0123456789"[i]) + ".5/24")}
	}
	for _, tt := range []struct {
		name string
		nics []Interface
		want string
	}{
		{"no interface", nil, "1 to 8"},
		{"nine interfaces", many, "1 to 8"},
		{"no address", []Interface{{MAC: ok.MAC}}, "0 addresses"},
		{"seventeen addresses", []Interface{{MAC: ok.MAC, Addresses: prefixes(strings.Split(strings.Repeat("10.9.0.5/24 ", 17), " ")[:17]...)}}, "17 addresses"},
		{"upper-case MAC", []Interface{{MAC: "52:54:00:0A:00:05", Addresses: ok.Addresses}}, "lower-case"},
		{"multicast MAC", []Interface{{MAC: "01:00:5e:00:00:01", Addresses: ok.Addresses}}, "unicast"},
		{"zero MAC", []Interface{{MAC: "00:00:00:00:00:00", Addresses: ok.Addresses}}, "unicast"},
		{"a MAC with a quote", []Interface{{MAC: `52:54:00:0a:00:05"`, Addresses: ok.Addresses}}, "not a unicast"},
		{"EUI-64 MAC", []Interface{{MAC: "52:54:00:0a:00:05:00:01", Addresses: ok.Addresses}}, "not a unicast"},
		{"MAC twice", []Interface{ok, {MAC: ok.MAC, Addresses: prefixes("10.9.0.6/24")}}, "another interface's"},
		{"address twice", []Interface{ok, {MAC: "52:54:00:0a:00:06", Addresses: prefixes("10.9.0.5/25")}}, "twice"},
		{"no prefix", []Interface{{MAC: ok.MAC, Addresses: []netip.Prefix{{}}}}, "without its prefix length"},
		{"IPv4 in IPv6", []Interface{{MAC: ok.MAC, Addresses: prefixes("::ffff:10.9.0.5/120")}}, "not an address with its prefix length"},
		{"loopback", []Interface{{MAC: ok.MAC, Addresses: prefixes("127.0.0.2/8")}}, "not a unicast"},
		{"link-local", []Interface{{MAC: ok.MAC, Addresses: prefixes("fe80::5/64")}}, "not a unicast"},
		{"multicast", []Interface{{MAC: ok.MAC, Addresses: prefixes("239.1.1.1/24")}}, "not a unicast"},
		{"a /31", []Interface{{MAC: ok.MAC, Addresses: prefixes("10.1.0.0/31")}}, "does not make a subnet"},
		{"network address", []Interface{{MAC: ok.MAC, Addresses: prefixes("10.9.0.0/24")}}, "network or broadcast"},
		{"broadcast address", []Interface{{MAC: ok.MAC, Addresses: prefixes("10.9.0.255/24")}}, "network or broadcast"},
		{"gateway outside", []Interface{{MAC: ok.MAC, Addresses: ok.Addresses, Gateways: addrs("10.9.1.1")}}, "none of the interface's subnets"},
		{"gateway of the other family", []Interface{{MAC: ok.MAC, Addresses: ok.Addresses, Gateways: addrs("fd09::1")}}, "none of the interface's subnets"},
		{"gateway its own address", []Interface{{MAC: ok.MAC, Addresses: ok.Addresses, Gateways: addrs("10.9.0.5")}}, "own address"},
		{"gateway link-local", []Interface{{MAC: ok.MAC, Addresses: prefixes("fd09::5/64"), Gateways: addrs("fe80::1")}}, "not a unicast"},
		{"gateway with a zone", []Interface{{MAC: ok.MAC, Addresses: prefixes("fd09::5/64"), Gateways: addrs("fd09::1%eth0")}}, "not a unicast"},
		{"gateway unset", []Interface{{MAC: ok.MAC, Addresses: ok.Addresses, Gateways: []netip.Addr{{}}}}, "not a unicast"},
		{"two IPv4 gateways", []Interface{{MAC: ok.MAC, Addresses: ok.Addresses, Gateways: addrs("10.9.0.1", "10.9.0.2")}}, "second IPv4 gateway"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NetworkConfig(tt.nics)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NetworkConfig = %v (%q), want an error with %q", err, b, tt.want)
			}
			if _, err := Build(Seed{InstanceID: "vm", Interfaces: tt.nics}); tt.nics != nil && err == nil {
				t.Error("Build takes what NetworkConfig refuses")
			}
		})
	}
}
