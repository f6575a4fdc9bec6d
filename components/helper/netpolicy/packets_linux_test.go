package netpolicy_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/helper/netpolicy/netpolicytest"
)

// lab is a namespace with bridge br0 (the host: 10.9.0.1/24, fd09::1/64),
// two instances' taps (A and B, veth pairs whose bridge ends are named by
// TapName), a port up0 bcd does not manage, and an outside network
// 192.0.2.0/24 the host routes to through wan0.
type lab struct {
	ns                *netpolicytest.NS
	gA, gB, up1, wan1 *netpolicytest.Socket
	br                *netpolicytest.Socket
	host              netpolicy.Host
	brMAC             net.HardwareAddr
}

var (
	macA, macB   = "52:54:00:0a:00:01", "52:54:00:0b:00:01"
	ipA, ipB     = netip.MustParseAddr("10.9.0.5"), netip.MustParseAddr("10.9.0.6")
	ip6A, ip6B   = netip.MustParseAddr("fd09::5"), netip.MustParseAddr("fd09::6")
	hostIP       = netip.MustParseAddr("10.9.0.1")
	hostIP6      = netip.MustParseAddr("fd09::1")
	outside      = netip.MustParseAddr("192.0.2.7")
	allNodes     = netip.MustParseAddr("ff02::1")
	markerSerial atomic.Int64
)

func marker() []byte {
	return []byte(fmt.Sprintf("bcd-probe-%08d", markerSerial.Add(1)))
}

func newLab(t *testing.T) *lab {
	ns := netpolicytest.New(t)
	ns.Bridge("br0", "10.9.0.1/24", "fd09::1/64")
	ns.Port("br0", netpolicy.TapName("vm-a", 0), "ga", macA)
	ns.Port("br0", netpolicy.TapName("vm-b", 0), "gb", macB)
	ns.Port("br0", "up0", "up1", "")
	ns.Port("", "wan0", "wan1", "")
	ns.Run("ip", "addr", "add", "192.0.2.1/24", "dev", "wan0")
	ns.Run("sysctl", "-qw", "net.ipv4.ip_forward=1")
	l := &lab{ns: ns, gA: ns.Open("ga"), gB: ns.Open("gb"), up1: ns.Open("up1"), wan1: ns.Open("wan1"), br: ns.Open("br0")}
	ns.Run("ip", "neigh", "replace", "192.0.2.7", "lladdr", l.wan1.HW.String(), "dev", "wan0")
	l.brMAC = l.br.HW
	l.host = netpolicy.Host{Bridges: map[string]netpolicy.Bridge{"br0": {MAC: l.brMAC.String(), Addrs: []netip.Addr{hostIP, hostIP6}}}}
	return l
}

// load plans and loads the policy of vm-a and vm-b.
func (l *lab) load(t *testing.T, policyA, policyB string) {
	t.Helper()
	in := []netpolicy.Instance{
		{ID: "vm-a", NICs: []netpolicy.NIC{{Bridge: "br0", MAC: macA, Addresses: []string{"10.9.0.5/24", "fd09::5/64"}, Policy: policyA}}},
		{ID: "vm-b", NICs: []netpolicy.NIC{{Bridge: "br0", MAC: macB, Addresses: []string{"10.9.0.6/24", "fd09::6/64"}, Policy: policyB}}},
	}
	taps, _, failed := netpolicy.Plan(in, l.host)
	if len(failed) > 0 {
		t.Fatalf("Plan failed %v", failed)
	}
	rules, err := netpolicy.Render(taps, l.host)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := l.ns.Nft(context.Background(), rules, "-f", "-"); err != nil {
		t.Fatalf("nft -f: %v\n%s\n%s", err, out, rules)
	}
}

// probe is one crafted frame: where it is written, where it is looked
// for, and whether it must arrive.
type probe struct {
	name string
	from *netpolicytest.Socket
	at   *netpolicytest.Socket
	pass bool
	// frame builds the frame around its marker.
	frame func(m []byte) []byte
}

// run writes every probe's frame, waits, and checks each arrived exactly
// when it should.
func run(t *testing.T, probes []probe) {
	t.Helper()
	marks := make([][]byte, len(probes))
	for i, p := range probes {
		marks[i] = marker()
		if err := p.from.Send(p.frame(marks[i])); err != nil {
			t.Fatalf("%s: writing the frame: %v", p.name, err)
		}
	}
	time.Sleep(400 * time.Millisecond)
	for i, p := range probes {
		if got := p.at.Saw(marks[i]); got != p.pass {
			verdict := map[bool]string{true: "arrived", false: "was dropped"}
			t.Errorf("%s: the frame %s at %s; want it %s", p.name, verdict[got], p.at.Name, verdict[p.pass])
		}
	}
}

func udp4From(srcMAC string, src, dst netip.Addr, dstMAC net.HardwareAddr, sport, dport uint16) func([]byte) []byte {
	return func(m []byte) []byte {
		return eth(dstMAC, mac(srcMAC), 0x0800, ipv4(src, dst, 17, udp(sport, dport, m)))
	}
}

func udp6From(srcMAC string, src, dst netip.Addr, sport, dport uint16) func([]byte) []byte {
	return func(m []byte) []byte {
		return eth(mac("33:33:00:00:00:01"), mac(srcMAC), 0x86dd, ipv6(src, dst, 17, udp(sport, dport, m)))
	}
}

func icmp6From(srcMAC string, src netip.Addr, body func([]byte) []byte) func([]byte) []byte {
	return func(m []byte) []byte {
		return eth(mac("33:33:00:00:00:01"), mac(srcMAC), 0x86dd, ipv6(src, allNodes, 58, body(m)))
	}
}

func arpFrom(srcMAC string, op uint16, spa, tpa netip.Addr) func([]byte) []byte {
	return func(m []byte) []byte {
		return eth(broadcastMAC, mac(srcMAC), 0x0806, arp(op, mac(srcMAC), spa, mac("00:00:00:00:00:00"), tpa, m))
	}
}

// TestTapGuards writes, from instance A's tap, the frames a tenant might
// forge and the same frames done right, and counts which reach B's tap:
// each forgery is dropped, each right frame arrives.
func TestTapGuards(t *testing.T) {
	l := newLab(t)
	l.load(t, netpolicy.Egress, netpolicy.Egress)
	llA := netpolicy.LinkLocal(macA)
	foreignMAC := "52:54:00:ee:ee:ee"
	run(t, []probe{
		{"right MAC and IPv4", l.gA, l.gB, true, udp4From(macA, ipA, ipB, broadcastMAC, 4000, 4000)},
		{"foreign MAC", l.gA, l.gB, false, udp4From(foreignMAC, ipA, ipB, broadcastMAC, 4000, 4000)},
		{"foreign IPv4", l.gA, l.gB, false, udp4From(macA, netip.MustParseAddr("10.9.0.77"), ipB, broadcastMAC, 4000, 4000)},
		{"neighbour's IPv4", l.gA, l.gB, false, udp4From(macA, ipB, ipB, broadcastMAC, 4000, 4000)},
		{"host's IPv4", l.gA, l.gB, false, udp4From(macA, hostIP, ipB, broadcastMAC, 4000, 4000)},
		{"host's MAC", l.gA, l.gB, false, udp4From(l.brMAC.String(), ipA, ipB, broadcastMAC, 4000, 4000)},
		{"DHCP request from 0.0.0.0", l.gA, l.gB, true, udp4From(macA, netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255"), broadcastMAC, 68, 67)},
		{"DHCP offer", l.gA, l.gB, false, udp4From(macA, ipA, netip.MustParseAddr("255.255.255.255"), broadcastMAC, 67, 68)},
		{"gratuitous ARP for its own address", l.gA, l.gB, true, arpFrom(macA, 2, ipA, ipA)},
		{"gratuitous ARP for the neighbour's address", l.gA, l.gB, false, arpFrom(macA, 2, ipB, ipB)},
		{"ARP claiming the host's address", l.gA, l.gB, false, arpFrom(macA, 2, hostIP, hostIP)},
		{"ARP request from its address", l.gA, l.gB, true, arpFrom(macA, 1, ipA, ipB)},
		{"right IPv6", l.gA, l.gB, true, udp6From(macA, ip6A, ip6B, 4000, 4000)},
		{"EUI-64 link-local", l.gA, l.gB, true, udp6From(macA, llA, allNodes, 4000, 4000)},
		{"foreign IPv6", l.gA, l.gB, false, udp6From(macA, netip.MustParseAddr("fd09::77"), ip6B, 4000, 4000)},
		{"another link-local", l.gA, l.gB, false, udp6From(macA, netip.MustParseAddr("fe80::1234"), allNodes, 4000, 4000)},
		{"DHCPv6 reply", l.gA, l.gB, false, udp6From(macA, llA, allNodes, 547, 546)},
		{"router advert", l.gA, l.gB, false, icmp6From(macA, llA, routerAdvert)},
		{"redirect", l.gA, l.gB, false, icmp6From(macA, llA, func(m []byte) []byte { return icmp6(137, append(make([]byte, 36), m...)) })},
		{"neighbour advert for its own address", l.gA, l.gB, true, icmp6From(macA, llA, func(m []byte) []byte { return neighbourAdvert(ip6A, m) })},
		{"neighbour advert for the neighbour's address", l.gA, l.gB, false, icmp6From(macA, llA, func(m []byte) []byte { return neighbourAdvert(ip6B, m) })},
		{"neighbour advert for the host's address", l.gA, l.gB, false, icmp6From(macA, llA, func(m []byte) []byte { return neighbourAdvert(hostIP6, m) })},
		{"neighbour solicit for DAD from ::", l.gA, l.gB, true, icmp6From(macA, netip.IPv6Unspecified(), func(m []byte) []byte { return neighbourSolicit(ip6A, m) })},
		{"UDP from ::", l.gA, l.gB, false, udp6From(macA, netip.IPv6Unspecified(), allNodes, 4000, 4000)},
		{"VLAN-tagged", l.gA, l.gB, false, func(m []byte) []byte {
			return eth(broadcastMAC, mac(macA), 0x8100, append([]byte{0, 5, 0x08, 0x00}, ipv4(ipA, ipB, 17, udp(1, 1, m))...))
		}},
		// A port bcd does not manage may not use an instance's addresses.
		{"A's IPv4 from another port", l.up1, l.gB, false, udp4From("52:54:00:cc:00:01", ipA, ipB, broadcastMAC, 4000, 4000)},
		{"A's MAC from another port", l.up1, l.gB, false, udp4From(macA, netip.MustParseAddr("10.9.0.99"), ipB, broadcastMAC, 4000, 4000)},
		{"ARP for A's address from another port", l.up1, l.gB, false, arpFrom("52:54:00:cc:00:01", 2, ipA, ipA)},
		{"A's IPv6 from another port", l.up1, l.gB, false, udp6From("52:54:00:cc:00:01", ip6A, ip6B, 4000, 4000)},
		{"another address from another port", l.up1, l.gB, true, udp4From("52:54:00:cc:00:01", netip.MustParseAddr("10.9.0.99"), ipB, broadcastMAC, 4000, 4000)},
	})
}

// TestPolicies: EGRESS reaches the outside through the host; PRIVATE its
// subnet and the host, not the outside; NONE the host only.
func TestPolicies(t *testing.T) {
	l := newLab(t)
	toB := udp4From(macA, ipA, ipB, broadcastMAC, 4000, 4000)
	toHost := udp4From(macA, ipA, hostIP, l.brMAC, 4000, 4000)
	toOutside := udp4From(macA, ipA, outside, l.brMAC, 4000, 4000)
	toB6 := udp6From(macA, ip6A, ip6B, 4000, 4000)
	fromB := udp4From(macB, ipB, ipA, broadcastMAC, 4000, 4000)
	for _, c := range []struct {
		policy                          string
		b, host, outside, b6, fromOther bool
	}{
		{netpolicy.Egress, true, true, true, true, true},
		{netpolicy.Private, true, true, false, true, true},
		{netpolicy.None, false, true, false, false, false},
	} {
		t.Run(c.policy, func(t *testing.T) {
			l.load(t, c.policy, netpolicy.Egress)
			run(t, []probe{
				{"to B", l.gA, l.gB, c.b, toB},
				{"to the host", l.gA, l.br, c.host, toHost},
				{"to the outside", l.gA, l.wan1, c.outside, toOutside},
				{"to B over IPv6", l.gA, l.gB, c.b6, toB6},
				{"from B", l.gB, l.gA, c.fromOther, fromB},
			})
		})
	}
}

// TestOffBridge: a tap taken off its bridge is a host interface, and the
// bcd_taps tables keep the instance from the host's IP and ARP stacks
// (the host answers neither ARP nor ping); without them it answers.
func TestOffBridge(t *testing.T) {
	l := newLab(t)
	l.load(t, netpolicy.Egress, netpolicy.Egress)
	tapA := netpolicy.TapName("vm-a", 0)
	l.ns.Run("ip", "link", "set", tapA, "nomaster")
	l.ns.Run("ip", "addr", "add", "10.99.0.1/24", "dev", tapA)
	tapIP := netip.MustParseAddr("10.99.0.1")
	answered := func() bool {
		l.gA.Send(arpFrom(macA, 1, netip.MustParseAddr("10.99.0.2"), tapIP)(marker()))
		time.Sleep(300 * time.Millisecond)
		return l.gA.SawFunc(func(f []byte) bool { return len(f) >= 42 && f[12] == 8 && f[13] == 6 && f[21] == 2 })
	}
	if answered() {
		t.Fatal("the host answered ARP on a tap off its bridge")
	}
	l.ns.Run("nft", "delete", "table", "inet", "bcd_taps")
	l.ns.Run("nft", "delete", "table", "arp", "bcd_taps")
	if !answered() {
		t.Fatal("without the bcd_taps tables the host still did not answer: the test cannot tell")
	}
}
