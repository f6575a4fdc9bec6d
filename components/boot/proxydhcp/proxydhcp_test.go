package proxydhcp

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

var (
	knownBIOS  = net.HardwareAddr{0x52, 0x54, 0x00, 0x00, 0x00, 0x01}
	knownUEFI  = net.HardwareAddr{0x52, 0x54, 0x00, 0x00, 0x00, 0x02}
	knownOwn   = net.HardwareAddr{0x52, 0x54, 0x00, 0x00, 0x00, 0x03}
	unknownMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x00, 0x00, 0x99}
	serverIP   = net.IPv4(127, 0, 0, 1).To4()
)

const scriptBase = "http://127.0.0.1:8080/boot/ipxe"

// fakeBackend knows a few MACs and holds the lease when told to.
type fakeBackend struct {
	entries map[string]Entry
	active  atomic.Bool
}

func (b *fakeBackend) Lookup(_ context.Context, mac net.HardwareAddr) (Entry, bool) {
	e, ok := b.entries[mac.String()]
	return e, ok
}

func (b *fakeBackend) Active() bool { return b.active.Load() }

func newBackend() *fakeBackend {
	b := &fakeBackend{entries: map[string]Entry{
		knownBIOS.String(): {},
		knownUEFI.String(): {},
		knownOwn.String(): {
			BootFiles: map[Arch]string{ArchUEFIx64: "custom/ipxe-snponly.efi"},
			ScriptURL: "http://127.0.0.1:8080/boot/ipxe?mac=52:54:00:00:00:03&entry=7",
		},
	}}
	b.active.Store(true)
	return b
}

// harness runs a Server on 127.0.0.1 and a client socket that receives
// its broadcasts.
type harness struct {
	t          *testing.T
	backend    *fakeBackend
	client     *net.UDPConn
	dhcp, pxe  *net.UDPAddr
	mu         sync.Mutex
	discovered []Discovery
}

func start(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, backend: newBackend()}
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	h.client = client
	s, err := New(Config{
		Addr:      "127.0.0.1:0",
		PXEAddr:   "127.0.0.1:0",
		ServerIP:  serverIP,
		ScriptURL: scriptBase,
		Backend:   h.backend,
		Broadcast: client.LocalAddr().(*net.UDPAddr),
		Discovered: func(_ context.Context, d Discovery) {
			h.mu.Lock()
			h.discovered = append(h.discovered, d)
			h.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	dhcp, pxe, err := s.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.dhcp, h.pxe = dhcp.LocalAddr().(*net.UDPAddr), pxe.LocalAddr().(*net.UDPAddr)
	done := make(chan error, 1)
	go func() { done <- s.ServeConns(ctx, dhcp, pxe) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeConns: %v", err)
		}
	})
	return h
}

func (h *harness) send(to *net.UDPAddr, p *dhcpv4.DHCPv4) {
	h.t.Helper()
	if _, err := h.client.WriteToUDP(p.ToBytes(), to); err != nil {
		h.t.Fatal(err)
	}
}

// next reads the next reply, or nil after the wait.
func (h *harness) next(wait time.Duration) *dhcpv4.DHCPv4 {
	h.t.Helper()
	buf := make([]byte, 2048)
	h.client.SetReadDeadline(time.Now().Add(wait))
	n, err := h.client.Read(buf)
	if err != nil {
		return nil
	}
	p, err := dhcpv4.FromBytes(buf[:n])
	if err != nil {
		h.t.Fatalf("reply does not parse: %v", err)
	}
	return p
}

// discover builds a PXE ROM's DISCOVER.
func discover(t *testing.T, mac net.HardwareAddr, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	base := []dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0, 0}),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, append([]byte{0}, bytes.Repeat([]byte{0xab}, 16)...)),
	}
	p, err := dhcpv4.NewDiscovery(mac, append(base, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func arch(code byte) dhcpv4.Modifier {
	return dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0, code})
}

func TestOffers(t *testing.T) {
	h := start(t)
	ipxeUserClass := dhcpv4.WithUserClass("iPXE", false)
	for _, tc := range []struct {
		name     string
		mac      net.HardwareAddr
		mods     []dhcpv4.Modifier
		bootFile string
	}{
		{"known BIOS client", knownBIOS, nil, "undionly.kpxe"},
		{"known BIOS client without option 93", knownBIOS, []dhcpv4.Modifier{dhcpv4.WithoutOption(dhcpv4.OptionClientSystemArchitectureType)}, "undionly.kpxe"},
		{"known UEFI x86-64 client (7)", knownUEFI, []dhcpv4.Modifier{arch(7)}, "ipxe.efi"},
		{"known UEFI x86-64 client (9)", knownUEFI, []dhcpv4.Modifier{arch(9)}, "ipxe.efi"},
		{"known UEFI arm64 client", knownUEFI, []dhcpv4.Modifier{arch(11)}, "snp-arm64.efi"},
		{"entry's own boot file", knownOwn, []dhcpv4.Modifier{arch(7)}, "custom/ipxe-snponly.efi"},
		{"entry's default for another arch", knownOwn, []dhcpv4.Modifier{arch(0)}, "undionly.kpxe"},
		{"iPXE client (user class)", knownBIOS, []dhcpv4.Modifier{ipxeUserClass}, scriptBase + "?mac=52:54:00:00:00:01"},
		{"iPXE client (RFC 3004 user class)", knownUEFI, []dhcpv4.Modifier{arch(7), dhcpv4.WithUserClass("iPXE", true)}, scriptBase + "?mac=52:54:00:00:00:02"},
		{"iPXE client (option 175)", knownUEFI, []dhcpv4.Modifier{arch(7), dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(175), []byte{0xb1, 1, 1})}, scriptBase + "?mac=52:54:00:00:00:02"},
		{"iPXE client with its entry's script", knownOwn, []dhcpv4.Modifier{ipxeUserClass}, "http://127.0.0.1:8080/boot/ipxe?mac=52:54:00:00:00:03&entry=7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := discover(t, tc.mac, tc.mods...)
			h.send(h.dhcp, req)
			offer := h.next(5 * time.Second)
			if offer == nil {
				t.Fatal("no offer")
			}
			checkReply(t, req, offer, dhcpv4.MessageTypeOffer, tc.bootFile)
			if !offer.IsBroadcast() {
				t.Error("the offer to a client without an address is not flagged broadcast")
			}
		})
	}
}

func checkReply(t *testing.T, req, reply *dhcpv4.DHCPv4, mt dhcpv4.MessageType, bootFile string) {
	t.Helper()
	if reply.OpCode != dhcpv4.OpcodeBootReply || reply.MessageType() != mt {
		t.Errorf("reply is %s %s, want BootReply %s", reply.OpCode, reply.MessageType(), mt)
	}
	if reply.TransactionID != req.TransactionID {
		t.Errorf("xid %s, want %s", reply.TransactionID, req.TransactionID)
	}
	if !bytes.Equal(reply.ClientHWAddr, req.ClientHWAddr) {
		t.Errorf("chaddr %s, want %s", reply.ClientHWAddr, req.ClientHWAddr)
	}
	if !reply.YourIPAddr.Equal(net.IPv4zero) {
		t.Errorf("yiaddr %s: a proxy never hands out an address", reply.YourIPAddr)
	}
	if !reply.ServerIPAddr.Equal(serverIP) || !reply.ServerIdentifier().Equal(serverIP) {
		t.Errorf("siaddr %s, option 54 %s, want %s", reply.ServerIPAddr, reply.ServerIdentifier(), serverIP)
	}
	if got := reply.ClassIdentifier(); got != "PXEClient" {
		t.Errorf("option 60 %q", got)
	}
	if got := reply.GetOneOption(dhcpv4.OptionVendorSpecificInformation); !bytes.Equal(got, []byte{6, 1, 8, 255}) {
		t.Errorf("option 43 %v, want [6 1 8 255]", got)
	}
	if reply.BootFileName != bootFile || reply.BootFileNameOption() != bootFile {
		t.Errorf("file field %q, option 67 %q, want %q", reply.BootFileName, reply.BootFileNameOption(), bootFile)
	}
	if got, want := reply.GetOneOption(dhcpv4.OptionClientMachineIdentifier), req.GetOneOption(dhcpv4.OptionClientMachineIdentifier); !bytes.Equal(got, want) {
		t.Errorf("option 97 %x, want it echoed (%x)", got, want)
	}
}

// TestNoAnswer: each packet gets no reply; a good DISCOVER sent right
// after is the first thing answered, which shows nothing came before it
// (the server handles one socket's packets in order).
func TestNoAnswer(t *testing.T) {
	h := start(t)
	for _, tc := range []struct {
		name      string
		prepare   func()
		pkt       func() *dhcpv4.DHCPv4
		to        func() *net.UDPAddr
		discovers bool
	}{
		{name: "unknown MAC", pkt: func() *dhcpv4.DHCPv4 { return discover(t, unknownMAC, arch(7)) }, discovers: true},
		{name: "unknown MAC running iPXE", pkt: func() *dhcpv4.DHCPv4 {
			return discover(t, unknownMAC, dhcpv4.WithUserClass("iPXE", false))
		}, discovers: true},
		{name: "lease not held", prepare: func() { h.backend.active.Store(false) }, pkt: func() *dhcpv4.DHCPv4 { return discover(t, knownBIOS) }},
		{name: "unknown MAC, lease not held", prepare: func() { h.backend.active.Store(false) }, pkt: func() *dhcpv4.DHCPv4 { return discover(t, unknownMAC) }},
		{name: "not a PXE client", pkt: func() *dhcpv4.DHCPv4 {
			return discover(t, knownBIOS, dhcpv4.WithoutOption(dhcpv4.OptionClassIdentifier))
		}},
		{name: "another vendor class", pkt: func() *dhcpv4.DHCPv4 {
			return discover(t, knownBIOS, dhcpv4.WithOption(dhcpv4.OptClassIdentifier("MSFT 5.0")))
		}},
		{name: "HTTP boot client", pkt: func() *dhcpv4.DHCPv4 {
			return discover(t, knownBIOS, dhcpv4.WithOption(dhcpv4.OptClassIdentifier("HTTPClient:Arch:00016")))
		}},
		{name: "architecture without a boot file (EFI IA32)", pkt: func() *dhcpv4.DHCPv4 { return discover(t, knownUEFI, arch(6)) }},
		{name: "REQUEST on port 67", pkt: func() *dhcpv4.DHCPv4 {
			return discover(t, knownBIOS, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest))
		}},
		{name: "DISCOVER on port 4011", pkt: func() *dhcpv4.DHCPv4 { return discover(t, knownBIOS) }, to: func() *net.UDPAddr { return h.pxe }},
		{name: "a reply, not a request", pkt: func() *dhcpv4.DHCPv4 {
			p := discover(t, knownBIOS)
			p.OpCode = dhcpv4.OpcodeBootReply
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.backend.active.Store(true)
			h.mu.Lock()
			h.discovered = nil
			h.mu.Unlock()
			if tc.prepare != nil {
				tc.prepare()
			}
			to := h.dhcp
			if tc.to != nil {
				to = tc.to()
			}
			bad := tc.pkt()
			h.send(to, bad)
			if !h.backend.active.Load() {
				// Nothing to follow with while the lease is not held:
				// wait a while for a reply that must not come.
				if r := h.next(300 * time.Millisecond); r != nil {
					t.Fatalf("answered: %s", r.Summary())
				}
				h.backend.active.Store(true)
			}
			good := discover(t, knownBIOS)
			h.send(h.dhcp, good)
			r := h.next(5 * time.Second)
			if r == nil {
				t.Fatal("the good DISCOVER after it got no offer")
			}
			if r.TransactionID != good.TransactionID {
				t.Fatalf("answered the packet that must get no answer: %s", r.Summary())
			}
			h.mu.Lock()
			got := h.discovered
			h.mu.Unlock()
			if tc.discovers {
				if len(got) != 1 || got[0].MAC.String() != unknownMAC.String() {
					t.Errorf("discovered %+v, want %s", got, unknownMAC)
				}
			} else if len(got) != 0 {
				t.Errorf("discovered %+v, want nothing", got)
			}
		})
	}
}

func TestDiscoveryDetails(t *testing.T) {
	h := start(t)
	h.send(h.dhcp, discover(t, unknownMAC, arch(11), dhcpv4.WithUserClass("iPXE", false)))
	h.send(h.dhcp, discover(t, knownBIOS))
	if h.next(5*time.Second) == nil {
		t.Fatal("no offer for the known client")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	want := Discovery{MAC: unknownMAC, Arch: ArchUEFIARM64, IPXE: true}
	if len(h.discovered) != 1 || h.discovered[0].MAC.String() != want.MAC.String() ||
		h.discovered[0].Arch != want.Arch || h.discovered[0].IPXE != want.IPXE {
		t.Errorf("discovered %+v, want %+v", h.discovered, want)
	}
}

// TestPort4011: a REQUEST to the PXE port gets an ACK with the same
// options, sent back to where it came from.
func TestPort4011(t *testing.T) {
	h := start(t)
	req := discover(t, knownUEFI, arch(7),
		dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithBroadcast(false),
		dhcpv4.WithClientIP(net.IPv4(127, 0, 0, 1)),
	)
	h.send(h.pxe, req)
	ack := h.next(5 * time.Second)
	if ack == nil {
		t.Fatal("no ACK on port 4011")
	}
	checkReply(t, req, ack, dhcpv4.MessageTypeAck, "ipxe.efi")
	if !ack.ClientIPAddr.Equal(req.ClientIPAddr) {
		t.Errorf("ciaddr %s, want %s", ack.ClientIPAddr, req.ClientIPAddr)
	}
}

func TestDestination(t *testing.T) {
	s, err := New(Config{ServerIP: serverIP, ScriptURL: scriptBase, Backend: newBackend()})
	if err != nil {
		t.Fatal(err)
	}
	src := &net.UDPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 68}
	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: 68}
	for _, tc := range []struct {
		name string
		mods []dhcpv4.Modifier
		p    port
		want *net.UDPAddr
	}{
		{"no address: broadcast", []dhcpv4.Modifier{dhcpv4.WithBroadcast(false)}, portDHCP, bcast},
		{"asked for broadcast", []dhcpv4.Modifier{dhcpv4.WithBroadcast(true), dhcpv4.WithClientIP(src.IP)}, portDHCP, bcast},
		{"has an address, unicast", []dhcpv4.Modifier{dhcpv4.WithBroadcast(false), dhcpv4.WithClientIP(src.IP)}, portDHCP, src},
		{"relayed", []dhcpv4.Modifier{dhcpv4.WithGatewayIP(net.IPv4(10, 0, 1, 1))}, portDHCP, &net.UDPAddr{IP: net.IPv4(10, 0, 1, 1).To4(), Port: 67}},
		{"port 4011 answers the sender", nil, portPXE, src},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := discover(t, knownBIOS, tc.mods...)
			got := s.destination(req, src, tc.p)
			if got.String() != tc.want.String() {
				t.Errorf("destination %s, want %s", got, tc.want)
			}
		})
	}
	if got := s.destination(discover(t, knownBIOS), src, portDHCP); got.String() != "255.255.255.255:68" {
		t.Errorf("default broadcast %s", got)
	}
}

func TestNewRefuses(t *testing.T) {
	b := newBackend()
	for name, cfg := range map[string]Config{
		"no backend":       {ServerIP: serverIP, ScriptURL: scriptBase},
		"no server IP":     {ScriptURL: scriptBase, Backend: b},
		"IPv6 server IP":   {ServerIP: net.ParseIP("fd00::1"), ScriptURL: scriptBase, Backend: b},
		"no script URL":    {ServerIP: serverIP, Backend: b},
		"tftp script URL":  {ServerIP: serverIP, ScriptURL: "tftp://x/y", Backend: b},
		"script URL 128 B": {ServerIP: serverIP, ScriptURL: "http://h/" + string(bytes.Repeat([]byte("a"), 110)), Backend: b},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}

// FuzzHandle: no input panics the packet handler, and no reply ever
// carries an address.
func FuzzHandle(f *testing.F) {
	s, err := New(Config{ServerIP: serverIP, ScriptURL: scriptBase, Backend: newBackend()})
	if err != nil {
		f.Fatal(err)
	}
	seed := func(mac net.HardwareAddr, mods ...dhcpv4.Modifier) {
		base := []dhcpv4.Modifier{
			dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00007:UNDI:003016")),
		}
		p, err := dhcpv4.NewDiscovery(mac, append(base, mods...)...)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p.ToBytes(), false)
		f.Add(p.ToBytes(), true)
	}
	seed(knownBIOS)
	seed(knownUEFI, arch(7))
	seed(knownOwn, dhcpv4.WithUserClass("iPXE", false))
	seed(knownUEFI, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), arch(11))
	seed(unknownMAC)
	seed(knownBIOS, dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0}))
	f.Add([]byte{}, false)
	f.Add([]byte{1, 1, 6, 0}, false)
	src := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 68}
	f.Fuzz(func(t *testing.T, pkt []byte, pxePort bool) {
		p := portDHCP
		if pxePort {
			p = portPXE
		}
		reply, dst := s.handle(context.Background(), pkt, src, p)
		if reply == nil {
			return
		}
		if dst == nil {
			t.Fatal("a reply without a destination")
		}
		if !reply.YourIPAddr.Equal(net.IPv4zero) {
			t.Fatalf("reply hands out %s", reply.YourIPAddr)
		}
		if _, err := dhcpv4.FromBytes(reply.ToBytes()); err != nil {
			t.Fatalf("reply does not parse back: %v", err)
		}
	})
}
