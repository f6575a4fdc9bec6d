package netpolicy_test

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Frames the packet tests write, built by hand so each field is what the
// case needs (a foreign MAC, a neighbour's address, a router advert).

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

var broadcastMAC = mac("ff:ff:ff:ff:ff:ff")

// eth is an Ethernet frame padded to 60 bytes.
func eth(dst, src net.HardwareAddr, etype uint16, payload []byte) []byte {
	b := append(append(append([]byte{}, dst...), src...), byte(etype>>8), byte(etype))
	b = append(b, payload...)
	for len(b) < 60 {
		b = append(b, 0)
	}
	return b
}

func csum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

func ipv4(src, dst netip.Addr, proto byte, payload []byte) []byte {
	h := make([]byte, 20)
	h[0], h[8], h[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], csum(h, 0))
	return append(h, payload...)
}

func udp(sport, dport uint16, data []byte) []byte {
	h := make([]byte, 8)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(8+len(data)))
	return append(h, data...) // checksum 0: none (IPv4); IPv6 readers here do not check it
}

func ipv6(src, dst netip.Addr, next byte, payload []byte) []byte {
	h := make([]byte, 40)
	h[0], h[6], h[7] = 0x60, next, 255
	binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	if next == 58 { // ICMPv6: its checksum over the pseudo-header
		var sum uint32
		pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, byte(len(payload)>>8), byte(len(payload)), 0, 0, 0, 58)
		for i := 0; i < len(pseudo); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(pseudo[i:]))
		}
		binary.BigEndian.PutUint16(payload[2:], csum(payload, sum))
	}
	return append(h, payload...)
}

// icmp6 is an ICMPv6 message: type, code, zero checksum, then body.
func icmp6(typ byte, body []byte) []byte {
	return append([]byte{typ, 0, 0, 0}, body...)
}

// neighbourAdvert is an NA for target with the override flag.
func neighbourAdvert(target netip.Addr, marker []byte) []byte {
	t := target.As16()
	body := append([]byte{0x20, 0, 0, 0}, t[:]...)
	return icmp6(136, append(body, marker...))
}

func neighbourSolicit(target netip.Addr, marker []byte) []byte {
	t := target.As16()
	body := append([]byte{0, 0, 0, 0}, t[:]...)
	return icmp6(135, append(body, marker...))
}

func routerAdvert(marker []byte) []byte {
	return icmp6(134, append([]byte{64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0}, marker...))
}

// arp is an ARP packet over Ethernet and IPv4, marker in its padding.
func arp(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr, marker []byte) []byte {
	b := []byte{0, 1, 8, 0, 6, 4, byte(op >> 8), byte(op)}
	s, d := spa.As4(), tpa.As4()
	b = append(append(b, sha...), s[:]...)
	b = append(append(b, tha...), d[:]...)
	return append(b, marker...)
}
