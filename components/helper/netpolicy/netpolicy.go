// Package netpolicy is the instances' network policy as bcd helper loads
// it: each NIC of the instances section (its tap, named by TapName from the
// instance id, its MAC, its IPAM addresses and PRIVATE, NONE or EGRESS)
// becomes rules in bcd's nftables tables, which this package renders
// itself from typed values only (interface names, MACs and addresses
// checked by pattern or parsed by net/netip), so no text from the node
// reaches nft. The same rules guard every tap whatever its policy: only
// its own MAC, addresses, EUI-64 link-local address and ARP; no foreign
// neighbour adverts; no DHCP server replies, router adverts or redirects;
// no use or claim of the host's bridge addresses; each guarded address
// bound to its tap against every other port; and, in the inet and arp
// bcd_taps tables, nothing to or from a bcd tap that is off its bridge.
//
// Decode reads the NICs from the instances section, Plan checks them
// against the host (a NIC whose policy cannot be expressed fails its
// instance, whose taps then pass nothing) and Render writes the ruleset
// that replaces all three tables at once (nft -f). docs/instances.md,
// "Network policy", describes it.
package netpolicy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/base/strictjson"
)

// The policies of a NIC.
const (
	// Egress: the NIC may reach anything the host routes to.
	Egress = "EGRESS"
	// Private: the NIC reaches its own subnets (the prefixes of its
	// addresses) and the host, and only they reach it.
	Private = "PRIVATE"
	// None: the NIC reaches the host only.
	None = "NONE"
)

// Bounds.
const (
	MaxNICs      = 8  // NICs of an instance (domainxml.MaxTaps)
	MaxAddresses = 16 // addresses of a NIC
	// TapPrefix starts every tap bcd names; the bcd_taps tables drop
	// whatever passes through an interface so named off its bridge.
	TapPrefix = "bcdt"
)

// The tables, as "family name", in the order Render writes them.
var Tables = []string{"bridge bcd_instances", "inet bcd_taps", "arp bcd_taps"}

// EC2 metadata addresses: AWS's instance metadata service answers for the
// host there, so on an EC2 host no tap may reach them.
var EC2Metadata = []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fd00:ec2::254")}

// NIC is one NIC of an instance as the section gives it.
type NIC struct {
	// Bridge is the host bridge its tap joins.
	Bridge string `json:"bridge"`
	// MAC is a unicast address in lower-case hex pairs.
	MAC string `json:"mac"`
	// Addresses are its IPAM addresses with their subnet's prefix length
	// ("10.0.0.5/24", "fd00::5/64").
	Addresses []string `json:"addresses,omitempty"`
	// Policy is EGRESS, PRIVATE or NONE.
	Policy string `json:"policy"`
}

// Tap is one NIC with what Plan derived: its tap, its instance and its
// parsed addresses.
type Tap struct {
	Name     string
	Instance string
	Index    int
	Bridge   string
	MAC      string
	Addrs    []netip.Prefix
	Policy   string
}

// Bridge is what the helper reads of a host bridge itself.
type Bridge struct {
	MAC   string
	Addrs []netip.Addr
}

// Host is what the renderer trusts about the host; the helper fills it
// from the host itself, never from the node.
type Host struct {
	// Bridges are the host's bridges by name; a NIC on another fails.
	Bridges map[string]Bridge
	// EC2: the host is an EC2 instance; taps may not reach EC2Metadata.
	EC2 bool
}

// TapName is the tap of an instance's NIC: bcdt, 10 hex digits of the
// SHA-256 of the instance id, and the NIC's index (0 to 7): 15
// characters, the kernel's longest interface name. The runtime names the
// tap so and the policy binds it, so neither is the node's to choose.
func TapName(instance string, index int) string {
	sum := sha256.Sum256([]byte(instance))
	return TapPrefix + hex.EncodeToString(sum[:5]) + strconv.Itoa(index)
}

// Section is the part of the instances section the policy reads: each
// instance's id and NICs. Other fields are the node's; the whole section
// was decoded strictly by the node and is signed.
type Section struct {
	Instances []struct {
		ID   string          `json:"id"`
		NICs json.RawMessage `json:"nics,omitempty"`
	} `json:"instances"`
}

// Decode reads every instance's NICs from the instances section, each
// NIC list strictly (no unknown field, no second value). The instances
// with their NICs in the section's order.
func Decode(section []byte) ([]Instance, error) {
	var s Section
	if len(strings.TrimSpace(string(section))) == 0 {
		return nil, nil
	}
	if err := json.Unmarshal(section, &s); err != nil {
		return nil, fmt.Errorf("the instances section: %w", err)
	}
	var out []Instance
	for i, in := range s.Instances {
		var nics []NIC
		if len(in.NICs) > 0 && string(in.NICs) != "null" {
			if err := strictjson.Decode(in.NICs, &nics); err != nil {
				return nil, fmt.Errorf("instances[%d].nics: %w", i, err)
			}
		}
		out = append(out, Instance{ID: in.ID, NICs: nics})
	}
	return out, nil
}

// Instance is an instance's id and NICs.
type Instance struct {
	ID   string
	NICs []NIC
}

// CheckNIC checks a NIC's own values (the node's Decode of the section
// runs it too): a bridge name, a unicast MAC, addresses with a prefix and
// a known policy that the addresses can express.
func CheckNIC(n NIC) error {
	switch {
	case !ifname(n.Bridge):
		return fmt.Errorf("bridge %q is not an interface name ([A-Za-z0-9_.-], 1 to 15)", n.Bridge)
	case !ValidMAC(n.MAC):
		return fmt.Errorf("mac %q is not a unicast address in lower-case hex pairs", n.MAC)
	case len(n.Addresses) > MaxAddresses:
		return fmt.Errorf("%d addresses; at most %d", len(n.Addresses), MaxAddresses)
	}
	switch n.Policy {
	case Egress:
	case Private, None:
		if len(n.Addresses) == 0 {
			return fmt.Errorf("policy %s cannot be expressed without the NIC's addresses", n.Policy)
		}
	default:
		return fmt.Errorf("policy %q is not EGRESS, PRIVATE or NONE", n.Policy)
	}
	seen := map[netip.Addr]bool{}
	for _, a := range n.Addresses {
		p, err := ParseAddress(a)
		if err != nil {
			return err
		}
		if seen[p.Addr()] {
			return fmt.Errorf("address %s given twice", p.Addr())
		}
		seen[p.Addr()] = true
	}
	return nil
}

// ParseAddress reads an IPAM address: a unicast IPv4 or IPv6 address
// with its subnet's prefix length, no zone, not loopback, multicast,
// link-local or unspecified, and not a subnet's own network address
// (IPv4 prefixes up to /30 also not its broadcast).
func ParseAddress(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("address %q is not an address with its prefix length (10.0.0.5/24, fd00::5/64)", s)
	}
	a := p.Addr()
	switch {
	case !a.IsGlobalUnicast() && !a.IsPrivate():
		return netip.Prefix{}, fmt.Errorf("address %s is not a unicast address an instance may hold", a)
	case p.Bits() == 0 || a.Is4() && p.Bits() > 30 && p.Bits() != 32 || a.Is6() && p.Bits() > 126 && p.Bits() != 128:
		return netip.Prefix{}, fmt.Errorf("address %s: prefix /%d does not make a subnet", s, p.Bits())
	case p.Bits() < 32 && a.Is4() || p.Bits() < 128 && a.Is6():
		if a == p.Masked().Addr() || a.Is4() && a == broadcast(p) {
			return netip.Prefix{}, fmt.Errorf("address %s is its subnet's network or broadcast address", s)
		}
	}
	return p, nil
}

func broadcast(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(b)
}

// ValidMAC reports whether m is a unicast MAC in lower-case hex pairs.
func ValidMAC(m string) bool {
	if len(m) != 17 {
		return false
	}
	for i := 0; i < 17; i++ {
		c := m[i]
		if i%3 == 2 {
			if c != ':' {
				return false
			}
		} else if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	first, _ := strconv.ParseUint(m[:2], 16, 8)
	return first&1 == 0 && m != "00:00:00:00:00:00"
}

// ifname reports whether s may name an interface: [A-Za-z0-9_.-], 1 to 15.
func ifname(s string) bool {
	if len(s) < 1 || len(s) > 15 || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// LinkLocal is the EUI-64 link-local address of mac: fe80:: with the MAC,
// its universal/local bit flipped and ff:fe in its middle.
func LinkLocal(mac string) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	var m [6]byte
	for i := range m {
		v, _ := strconv.ParseUint(mac[i*3:i*3+2], 16, 8)
		m[i] = byte(v)
	}
	b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15] = m[0]^2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]
	return netip.AddrFrom16(b)
}

// Plan checks the instances' NICs against the host and against each
// other and returns the taps to guard. An instance with a NIC that cannot
// be expressed is in failed with the reason, and its taps in blocked:
// they pass nothing. Refused, failing the instance: a NIC on a bridge the
// host lacks, the bridge's own MAC or one of its addresses, a MAC or
// address another instance's NIC has (both instances fail), a tap name
// another instance's NIC has.
func Plan(instances []Instance, h Host) (taps []Tap, blocked []string, failed map[string]string) {
	failed = map[string]string{}
	fail := func(id, format string, args ...any) {
		if _, ok := failed[id]; !ok {
			failed[id] = fmt.Sprintf(format, args...)
		}
	}
	var all []Tap
	for _, in := range instances {
		if len(in.NICs) > MaxNICs {
			fail(in.ID, "%d NICs; at most %d", len(in.NICs), MaxNICs)
		}
		for i, n := range in.NICs {
			if i >= MaxNICs {
				break
			}
			t := Tap{Name: TapName(in.ID, i), Instance: in.ID, Index: i, Bridge: n.Bridge, MAC: n.MAC, Policy: n.Policy}
			all = append(all, t)
			if err := CheckNIC(n); err != nil {
				fail(in.ID, "nics[%d]: %v", i, err)
				continue
			}
			for _, a := range n.Addresses {
				p, _ := ParseAddress(a)
				all[len(all)-1].Addrs = append(all[len(all)-1].Addrs, p)
			}
		}
	}
	owner := map[string]string{} // a MAC, address or tap name -> the instance that has it
	for _, t := range all {
		if err := checkTap(t, h); err != nil {
			fail(t.Instance, "nics[%d]: %v", t.Index, err)
		}
		keys := []string{"tap " + t.Name, "mac " + t.MAC}
		for _, p := range t.Addrs {
			keys = append(keys, "address "+p.Addr().String())
		}
		for _, k := range keys {
			if other, ok := owner[k]; ok && other != t.Instance {
				fail(t.Instance, "nics[%d]: %s is also instance %s's", t.Index, k, other)
				fail(other, "%s is also instance %s's", k, t.Instance)
			}
			owner[k] = t.Instance
		}
	}
	for _, t := range all {
		if _, bad := failed[t.Instance]; bad {
			if !slices.Contains(blocked, t.Name) {
				blocked = append(blocked, t.Name)
			}
			continue
		}
		taps = append(taps, t)
	}
	return taps, blocked, failed
}

// checkTap checks one tap against the host: its name is the one TapName
// gives its instance's NIC (a tap of another instance is never bound to
// this one's addresses), its bridge is the host's, and neither its MAC nor
// an address is one of the bridge's.
func checkTap(t Tap, h Host) error {
	if t.Name != TapName(t.Instance, t.Index) {
		return fmt.Errorf("tap %s is not this instance's (TapName gives %s)", t.Name, TapName(t.Instance, t.Index))
	}
	br, ok := h.Bridges[t.Bridge]
	if !ok {
		return fmt.Errorf("bridge %s is not a bridge of this host", t.Bridge)
	}
	if strings.EqualFold(br.MAC, t.MAC) {
		return fmt.Errorf("mac %s is the host bridge %s's own", t.MAC, t.Bridge)
	}
	for _, p := range t.Addrs {
		for _, b := range br.Addrs {
			if p.Addr() == b {
				return fmt.Errorf("address %s is the host bridge %s's own", b, t.Bridge)
			}
		}
		for _, m := range EC2Metadata {
			if p.Addr() == m {
				return fmt.Errorf("address %s is a metadata service's address", m)
			}
		}
	}
	return nil
}
