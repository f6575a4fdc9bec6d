package netpolicy

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Check refuses taps Render would not render: a tap that is not its
// instance's (TapName), a bridge the host lacks, the bridge's MAC or
// addresses, values that are not what Plan makes, and a tap, MAC or
// address two taps share.
func Check(taps []Tap, h Host) error {
	seen := map[string]string{}
	claim := func(k, tap string) error {
		if other, ok := seen[k]; ok {
			return fmt.Errorf("%s is both %s's and %s's", k, other, tap)
		}
		seen[k] = tap
		return nil
	}
	for _, t := range taps {
		if !ValidMAC(t.MAC) || !ifname(t.Bridge) || t.Index < 0 || t.Index >= MaxNICs || len(t.Addrs) > MaxAddresses {
			return fmt.Errorf("tap %s: not a NIC Plan makes", t.Name)
		}
		switch t.Policy {
		case Egress:
		case Private, None:
			if len(t.Addrs) == 0 {
				return fmt.Errorf("tap %s: policy %s without addresses", t.Name, t.Policy)
			}
		default:
			return fmt.Errorf("tap %s: policy %q", t.Name, t.Policy)
		}
		if err := checkTap(t, h); err != nil {
			return err
		}
		if err := claim("tap "+t.Name, t.Name); err != nil {
			return err
		}
		if err := claim("mac "+t.MAC, t.Name); err != nil {
			return err
		}
		for _, p := range t.Addrs {
			if _, err := ParseAddress(p.String()); err != nil {
				return fmt.Errorf("tap %s: %w", t.Name, err)
			}
			if err := claim("address "+p.Addr().String(), t.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// Render writes the ruleset that replaces bcd's three tables at once
// (`nft -f`: each table is declared, deleted and written again in one
// transaction), after Check. A bcd tap not among taps (its instance
// failed, or no instance names it) passes nothing. Every value in it is typed: interface names
// and MACs checked by pattern, addresses written by net/netip.
func Render(taps []Tap, h Host) ([]byte, error) {
	if err := Check(taps, h); err != nil {
		return nil, err
	}
	var b strings.Builder
	w := func(parts ...string) {
		for _, p := range parts {
			b.WriteString(p)
		}
		b.WriteByte('\n')
	}
	w("# bcd's instance network policy, rendered by bcd helper; replaced whole on each load.")
	for _, t := range Tables {
		w("table ", t)
		w("delete table ", t)
	}
	var host4, host6 []netip.Prefix
	for _, name := range sortedKeys(h.Bridges) {
		for _, a := range h.Bridges[name].Addrs {
			p := netip.PrefixFrom(a, a.BitLen())
			if a.Is4() {
				host4 = append(host4, p)
			} else {
				host6 = append(host6, p)
			}
		}
	}

	w("table bridge bcd_instances {")
	// prerouting: every frame entering the bridge from a port.
	w("\tchain prerouting {")
	w("\t\ttype filter hook prerouting priority -300; policy accept;")
	if len(taps) > 0 {
		var m []string
		for _, t := range taps {
			m = append(m, quote(t.Name)+" : jump from_"+t.Name)
		}
		w("\t\tiifname vmap { ", strings.Join(m, ", "), " }")
	}
	// A bcd tap no policy guards (blocked, or unknown) passes nothing.
	w("\t\tiifname ", quote(TapPrefix+"*"), " drop")
	// Each guarded MAC and address is its tap's against every other port.
	for _, t := range taps {
		not := "iifname != " + quote(t.Name)
		w("\t\tether saddr ", t.MAC, " ", not, " drop")
		if len(t.Addrs) == 0 {
			continue
		}
		for _, a := range append(addrs(t.Addrs), LinkLocal(t.MAC)) {
			if a.Is4() {
				w("\t\tip saddr ", a.String(), " ", not, " drop")
				w("\t\tarp saddr ip ", a.String(), " ", not, " drop")
			} else {
				w("\t\tip6 saddr ", a.String(), " ", not, " drop")
				w("\t\ticmpv6 type nd-neighbor-advert ", ndTarget, " ", hex128(a), " ", not, " drop")
			}
		}
	}
	w("\t}")

	for _, t := range taps {
		renderFrom(w, t, host4, host6, h.EC2)
	}

	// forward: frames between ports. NONE taps exchange none; the rest
	// are checked on their way into a tap.
	w("\tchain forward {")
	w("\t\ttype filter hook forward priority -300; policy accept;")
	var into []string
	for _, t := range taps {
		if t.Policy == None {
			w("\t\tiifname ", quote(t.Name), " drop")
			into = append(into, quote(t.Name)+" : drop")
		} else {
			into = append(into, quote(t.Name)+" : jump into_"+t.Name)
		}
	}
	if len(into) > 0 {
		w("\t\toifname vmap { ", strings.Join(into, ", "), " }")
	}
	w("\t\toifname ", quote(TapPrefix+"*"), " drop")
	w("\t}")
	// output: frames the host sends into a tap.
	w("\tchain output {")
	w("\t\ttype filter hook output priority -300; policy accept;")
	var out []string
	for _, t := range taps {
		out = append(out, quote(t.Name)+" : jump host_"+t.Name)
	}
	if len(out) > 0 {
		w("\t\toifname vmap { ", strings.Join(out, ", "), " }")
	}
	w("\t\toifname ", quote(TapPrefix+"*"), " drop")
	w("\t}")
	for _, t := range taps {
		// into_: from another port. PRIVATE: only its subnets.
		w("\tchain into_", t.Name, " {")
		if t.Policy == Private {
			s4, s6 := subnets(t.Addrs)
			w("\t\tip saddr != ", set(s4, "0.0.0.0/32"), " drop")
			w("\t\tip6 saddr != ", set(s6, "::/128", "fe80::/10"), " drop")
		}
		w("\t\taccept")
		w("\t}")
		// host_: from the host, which also routes others' traffic.
		w("\tchain host_", t.Name, " {")
		switch t.Policy {
		case Private:
			s4, s6 := subnets(t.Addrs)
			w("\t\tip saddr != ", set(append(s4, host4...), "0.0.0.0/32"), " drop")
			w("\t\tip6 saddr != ", set(append(s6, host6...), "::/128", "fe80::/10"), " drop")
		case None:
			w("\t\tip saddr != ", set(host4, "0.0.0.0/32"), " drop")
			w("\t\tip6 saddr != ", set(host6, "::/128", "fe80::/10"), " drop")
		}
		w("\t\taccept")
		w("\t}")
	}
	w("}")

	// The backstop: a bcd tap that is off its bridge is an interface of
	// the host's own IP and ARP stacks, and passes nothing there.
	w("table inet bcd_taps {")
	w("\tchain prerouting {")
	w("\t\ttype filter hook prerouting priority -300; policy accept;")
	w("\t\tiifname ", quote(TapPrefix+"*"), " drop")
	w("\t}")
	w("\tchain postrouting {")
	w("\t\ttype filter hook postrouting priority -300; policy accept;")
	w("\t\toifname ", quote(TapPrefix+"*"), " drop")
	w("\t}")
	w("}")
	w("table arp bcd_taps {")
	w("\tchain input {")
	w("\t\ttype filter hook input priority -300; policy accept;")
	w("\t\tiifname ", quote(TapPrefix+"*"), " drop")
	w("\t}")
	w("\tchain output {")
	w("\t\ttype filter hook output priority -300; policy accept;")
	w("\t\toifname ", quote(TapPrefix+"*"), " drop")
	w("\t}")
	w("}")
	return []byte(b.String()), nil
}

// ndTarget is the target address of a neighbour advert: the 128 bits
// after the ICMPv6 header's first 8 bytes (this nft has no name for it).
const ndTarget = "@th,64,128"

// renderFrom writes the chain every frame from tap t passes: the guards,
// then the policy's destinations.
func renderFrom(w func(...string), t Tap, host4, host6 []netip.Prefix, ec2 bool) {
	w("\tchain from_", t.Name, " {")
	w("\t\tether saddr != ", t.MAC, " drop")
	w("\t\tether type != { arp, ip, ip6 } drop")
	w("\t\tarp saddr ether != ", t.MAC, " drop")
	// DHCP and DHCPv6 server replies, router adverts and redirects.
	w("\t\tudp sport { 67, 547 } drop")
	w("\t\ticmpv6 type { nd-router-advert, nd-redirect } drop")
	w("\t\ticmp type redirect drop")
	// No use or claim of the host's bridge addresses.
	if len(host4) > 0 {
		w("\t\tip saddr ", set(host4), " drop")
		w("\t\tarp saddr ip ", set(host4), " drop")
	}
	if len(host6) > 0 {
		w("\t\tip6 saddr ", set(host6), " drop")
		w("\t\ticmpv6 type nd-neighbor-advert ", ndTarget, " ", hexSet(addrs(host6)), " drop")
	}
	if len(t.Addrs) > 0 {
		// Only its own addresses; 0.0.0.0 only to ask a DHCP server, ::
		// only for duplicate address detection and MLD.
		var own4, own6 []netip.Prefix
		for _, a := range addrs(t.Addrs) {
			if a.Is4() {
				own4 = append(own4, netip.PrefixFrom(a, 32))
			} else {
				own6 = append(own6, netip.PrefixFrom(a, 128))
			}
		}
		own6 = append(own6, netip.PrefixFrom(LinkLocal(t.MAC), 128))
		w("\t\tarp saddr ip != ", set(own4, "0.0.0.0/32"), " drop")
		w("\t\tip saddr != ", set(own4, "0.0.0.0/32"), " drop")
		w("\t\tip saddr 0.0.0.0 udp dport != 67 drop")
		w("\t\tip saddr 0.0.0.0 meta l4proto != udp drop")
		w("\t\tip6 saddr != ", set(own6, "::/128"), " drop")
		w("\t\tip6 saddr :: meta l4proto != ipv6-icmp drop")
		w("\t\tip6 saddr :: icmpv6 type != { nd-neighbor-solicit, mld2-listener-report } drop")
		w("\t\ticmpv6 type nd-neighbor-advert ", ndTarget, " != ", hexSet(addrs(own6)), " drop")
	}
	if ec2 {
		w("\t\tip daddr ", EC2Metadata[0].String(), " drop")
		w("\t\tip6 daddr ", EC2Metadata[1].String(), " drop")
	}
	switch t.Policy {
	case Private:
		s4, s6 := subnets(t.Addrs)
		w("\t\tip daddr != ", set(append(s4, host4...), "255.255.255.255/32"), " drop")
		w("\t\tip6 daddr != ", set(append(s6, host6...), "fe80::/10", "ff02::/16"), " drop")
	case None:
		w("\t\tip daddr != ", set(host4, "255.255.255.255/32"), " drop")
		w("\t\tip6 daddr != ", set(host6, "fe80::/10", "ff02::/16"), " drop")
	}
	w("\t\taccept")
	w("\t}")
}

// quote writes an interface name nft reads as a string; only names
// ifname accepts, or TapPrefix*, ever reach it.
func quote(s string) string {
	if !ifname(strings.TrimSuffix(s, "*")) {
		panic(errors.New("netpolicy: an unchecked interface name reached the renderer"))
	}
	return `"` + s + `"`
}

func addrs(ps []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, p := range ps {
		out = append(out, p.Addr())
	}
	return out
}

// subnets are the masked prefixes of a NIC's addresses, by family.
func subnets(ps []netip.Prefix) (v4, v6 []netip.Prefix) {
	for _, p := range ps {
		if p.Addr().Is4() {
			v4 = append(v4, p.Masked())
		} else {
			v6 = append(v6, p.Masked())
		}
	}
	return v4, v6
}

// set writes an anonymous set of prefixes (and the fixed extra ones),
// without duplicates or a prefix inside another: nft refuses overlapping
// intervals.
func set(ps []netip.Prefix, extra ...string) string {
	all := slices.Clone(ps)
	for _, e := range extra {
		all = append(all, netip.MustParsePrefix(e))
	}
	slices.SortFunc(all, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
	var keep []netip.Prefix
	for _, p := range all {
		inside := false
		for _, k := range keep {
			if k.Contains(p.Addr()) && k.Bits() <= p.Bits() {
				inside = true
				break
			}
		}
		if !inside {
			keep = append(keep, p)
		}
	}
	var parts []string
	for _, p := range keep {
		if p.Bits() == p.Addr().BitLen() {
			parts = append(parts, p.Addr().String())
		} else {
			parts = append(parts, p.String())
		}
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

// hex128 writes an IPv6 address as the 128-bit number raw payload
// matches compare with.
func hex128(a netip.Addr) string {
	b := a.As16()
	return "0x" + hex.EncodeToString(b[:])
}

func hexSet(as []netip.Addr) string {
	var parts []string
	for _, a := range as {
		if a.Is6() && !slices.Contains(parts, hex128(a)) {
			parts = append(parts, hex128(a))
		}
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
