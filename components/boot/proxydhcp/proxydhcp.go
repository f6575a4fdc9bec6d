// Package proxydhcp is the site agent's proxy DHCP server (PXE spec 2.1,
// "proxyDHCP"): beside the provisioning network's own DHCP server, which
// hands out the addresses, it tells a PXE ROM which boot file to load, and
// never hands out an address itself (yiaddr is always 0).
//
// It answers only PXE clients (option 60 starting "PXEClient") whose MAC
// has a boot entry (Backend.Lookup), and only while the site agent holds
// the site's boot lease (Backend.Active); every other packet goes
// unanswered, and the MAC of an unknown PXE client is reported through
// Config.Discovered. The boot file follows the client's architecture
// (option 93): undionly.kpxe for BIOS, ipxe.efi for UEFI x86-64,
// snp-arm64.efi for UEFI arm64, each loaded over TFTP from Config.ServerIP;
// a client that already runs iPXE (user class "iPXE" or option 175) gets
// the URL of its iPXE script over HTTP instead.
//
// The offer carries what the iPXE ROMs we test accept: option 53 OFFER,
// option 54 and siaddr set to ServerIP, option 60 "PXEClient", option 43
// {6, 1, 8, 255} (PXE discovery control: no boot server discovery, use
// the boot file), and the boot file in option 67 and the BOOTP file field.
// It listens on UDP 67 (DISCOVER -> OFFER) and 4011 (REQUEST -> ACK with
// the same options).
package proxydhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// Arch is the firmware a PXE client runs, from its option 93.
type Arch string

// The architectures the server boots.
const (
	ArchBIOS      Arch = "bios"        // option 93 = 0 (or absent)
	ArchUEFIx64   Arch = "uefi-x86-64" // option 93 = 7 or 9
	ArchUEFIARM64 Arch = "uefi-arm64"  // option 93 = 11
)

// DefaultBootFile is the TFTP file for arch when the entry names none:
// the iPXE builds the site agent serves.
func DefaultBootFile(arch Arch) string {
	switch arch {
	case ArchBIOS:
		return "undionly.kpxe"
	case ArchUEFIx64:
		return "ipxe.efi"
	case ArchUEFIARM64:
		return "snp-arm64.efi"
	}
	return ""
}

// Entry is what the backend knows about one machine's boot.
type Entry struct {
	// BootFiles names the TFTP boot file per architecture; an
	// architecture missing here gets DefaultBootFile.
	BootFiles map[Arch]string
	// ScriptURL is the iPXE script URL for a client that already runs
	// iPXE; empty means Config.ScriptURL with ?mac=<mac> added.
	ScriptURL string
}

// Backend says which machines to answer and when.
type Backend interface {
	// Lookup returns the boot entry of the machine with mac, if any.
	Lookup(ctx context.Context, mac net.HardwareAddr) (Entry, bool)
	// Active reports whether this site agent holds the boot lease now;
	// the server answers nothing while it does not.
	Active() bool
}

// Discovery is a PXE client without a boot entry.
type Discovery struct {
	MAC  net.HardwareAddr
	Arch Arch // empty when option 93 names an architecture not booted
	IPXE bool // the client already runs iPXE
}

// Config configures a Server.
type Config struct {
	// Addr is the DHCP address to listen on (default ":67").
	Addr string
	// PXEAddr is the PXE boot server address (default ":4011").
	PXEAddr string
	// Interface, when set, binds both sockets to that network interface
	// (SO_BINDTODEVICE), the provisioning network's bridge or NIC. Set it
	// in production: without it a broadcast offer leaves through the
	// interface of the default route, and packets from every network are
	// read.
	Interface string
	// ServerIP is this server's IPv4 address on the provisioning network:
	// option 54 and the TFTP server (siaddr).
	ServerIP net.IP
	// ScriptURL is the iPXE script URL a client that already runs iPXE
	// gets, with ?mac=<mac> added, e.g. http://10.0.0.1:8080/boot/ipxe.
	ScriptURL string
	// Backend decides which machines are answered; required.
	Backend Backend
	// Discovered, when set, is called for a PXE client whose MAC has no
	// boot entry, while the lease is held. It runs on the receiving
	// goroutine, so it should only record.
	Discovered func(ctx context.Context, d Discovery)
	// Broadcast is where replies to be broadcast go (default
	// 255.255.255.255:68). Tests point it at a loopback client.
	Broadcast *net.UDPAddr
	// Log receives the server's records; nil discards them.
	Log *slog.Logger
}

// Server is a proxy DHCP server.
type Server struct {
	cfg Config
	log *slog.Logger
}

// bootFileMax is the room in the BOOTP file field (128 bytes, NUL ended).
const bootFileMax = 127

// New checks cfg and applies its defaults.
func New(cfg Config) (*Server, error) {
	if cfg.Backend == nil {
		return nil, errors.New("creating proxy DHCP server: no backend")
	}
	if cfg.ServerIP.To4() == nil || cfg.ServerIP.IsUnspecified() {
		return nil, errors.New("creating proxy DHCP server: ServerIP must be an IPv4 address")
	}
	cfg.ServerIP = cfg.ServerIP.To4()
	if cfg.ScriptURL == "" {
		return nil, errors.New("creating proxy DHCP server: no iPXE script URL")
	}
	if !strings.HasPrefix(cfg.ScriptURL, "http://") && !strings.HasPrefix(cfg.ScriptURL, "https://") {
		return nil, errors.New("creating proxy DHCP server: the iPXE script URL must be http:// or https://")
	}
	if len(scriptURL(cfg.ScriptURL, make(net.HardwareAddr, 6))) > bootFileMax {
		return nil, fmt.Errorf("creating proxy DHCP server: the iPXE script URL with ?mac= is longer than the %d bytes of the BOOTP file field", bootFileMax)
	}
	if cfg.Addr == "" {
		cfg.Addr = ":67"
	}
	if cfg.PXEAddr == "" {
		cfg.PXEAddr = ":4011"
	}
	if cfg.Broadcast == nil {
		cfg.Broadcast = &net.UDPAddr{IP: net.IPv4bcast, Port: 68}
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log.With("component", "proxydhcp")}, nil
}

// Listen opens the DHCP (Config.Addr) and PXE (Config.PXEAddr) sockets
// with SO_REUSEADDR, SO_REUSEPORT and SO_BROADCAST, and SO_BINDTODEVICE
// when Config.Interface is set, so they share port 67 with the network's
// DHCP server.
func (s *Server) Listen(ctx context.Context) (dhcp, pxe net.PacketConn, err error) {
	lc := net.ListenConfig{Control: socketControl(s.cfg.Interface)}
	dhcp, err = lc.ListenPacket(ctx, "udp4", s.cfg.Addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listening for proxy DHCP on %s: %w", s.cfg.Addr, err)
	}
	pxe, err = lc.ListenPacket(ctx, "udp4", s.cfg.PXEAddr)
	if err != nil {
		dhcp.Close()
		return nil, nil, fmt.Errorf("listening for PXE on %s: %w", s.cfg.PXEAddr, err)
	}
	return dhcp, pxe, nil
}

// Serve listens and answers until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	dhcp, pxe, err := s.Listen(ctx)
	if err != nil {
		return err
	}
	return s.ServeConns(ctx, dhcp, pxe)
}

// ServeConns answers on sockets the caller opened (Listen's) until ctx
// ends, then closes them. Either may be nil.
func (s *Server) ServeConns(ctx context.Context, dhcp, pxe net.PacketConn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, c := range []struct {
		conn net.PacketConn
		port port
	}{{dhcp, portDHCP}, {pxe, portPXE}} {
		if c.conn == nil {
			continue
		}
		stop := context.AfterFunc(ctx, func() { c.conn.Close() })
		defer stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.serveConn(ctx, c.conn, c.port); err != nil {
				errs[i] = err
				cancel() // one socket failing stops both
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// port says which socket a packet arrived on.
type port int

const (
	portDHCP port = iota // 67: DISCOVER -> OFFER
	portPXE              // 4011: REQUEST -> ACK
)

func (s *Server) serveConn(ctx context.Context, conn net.PacketConn, p port) error {
	s.log.Info("proxy DHCP listening", "addr", conn.LocalAddr().String())
	buf := make([]byte, 4096)
	for {
		n, addr, err := conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			conn.Close()
			return fmt.Errorf("proxy DHCP: reading from %s: %w", conn.LocalAddr(), err)
		}
		src, _ := addr.(*net.UDPAddr)
		reply, dst := s.handle(ctx, buf[:n], src, p)
		if reply == nil {
			continue
		}
		if _, err := conn.WriteTo(reply.ToBytes(), dst); err != nil {
			s.log.Warn("proxy DHCP: sending the reply", "mac", reply.ClientHWAddr.String(), "to", dst.String(), "err", err)
		}
	}
}

// handle decides the reply to one packet and where it goes; nil when the
// packet gets no answer. It never panics on any input.
func (s *Server) handle(ctx context.Context, pkt []byte, src *net.UDPAddr, p port) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	req, err := dhcpv4.FromBytes(pkt)
	if err != nil {
		return nil, nil
	}
	if req.OpCode != dhcpv4.OpcodeBootRequest || req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return nil, nil
	}
	mac := req.ClientHWAddr
	log := s.log.With("mac", mac.String())

	var replyType dhcpv4.MessageType
	switch mt := req.MessageType(); {
	case p == portDHCP && mt == dhcpv4.MessageTypeDiscover:
		replyType = dhcpv4.MessageTypeOffer
	case p == portPXE && mt == dhcpv4.MessageTypeRequest:
		replyType = dhcpv4.MessageTypeAck
	default:
		return nil, nil // REQUESTs on 67 belong to the DHCP server
	}
	if !strings.HasPrefix(req.ClassIdentifier(), "PXEClient") {
		return nil, nil // not a PXE client
	}
	if !s.cfg.Backend.Active() {
		log.Debug("proxy DHCP: not answering, the boot lease is not held")
		return nil, nil
	}

	arch, archKnown := clientArch(req)
	ipxe := isIPXE(req)
	entry, ok := s.cfg.Backend.Lookup(ctx, mac)
	if !ok {
		log.Debug("proxy DHCP: PXE client without a boot entry", "arch", string(arch), "ipxe", ipxe)
		if s.cfg.Discovered != nil {
			s.cfg.Discovered(ctx, Discovery{MAC: append(net.HardwareAddr(nil), mac...), Arch: arch, IPXE: ipxe})
		}
		return nil, nil
	}

	var bootFile string
	switch {
	case ipxe:
		bootFile = entry.ScriptURL
		if bootFile == "" {
			bootFile = scriptURL(s.cfg.ScriptURL, mac)
		}
	case !archKnown:
		log.Warn("proxy DHCP: not answering a client architecture without a boot file", "arch_code", archCode(req))
		return nil, nil
	default:
		bootFile = entry.BootFiles[arch]
		if bootFile == "" {
			bootFile = DefaultBootFile(arch)
		}
	}
	if bootFile == "" || len(bootFile) > bootFileMax {
		log.Error("proxy DHCP: the boot file name is empty or longer than the BOOTP file field", "bytes", len(bootFile))
		return nil, nil
	}

	reply, err := dhcpv4.NewReplyFromRequest(req,
		dhcpv4.WithMessageType(replyType),
		dhcpv4.WithServerIP(s.cfg.ServerIP),
		dhcpv4.WithYourIP(net.IPv4zero),
		dhcpv4.WithClientIP(req.ClientIPAddr),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(s.cfg.ServerIP)),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient")),
		dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{6, 1, 8, 255})),
		dhcpv4.WithOption(dhcpv4.OptBootFileName(bootFile)),
		dhcpv4.WithOptionCopied(req, dhcpv4.OptionClientMachineIdentifier),
	)
	if err != nil {
		log.Error("proxy DHCP: building the reply", "err", err)
		return nil, nil
	}
	reply.BootFileName = bootFile

	dst := s.destination(req, src, p)
	if dst == nil {
		return nil, nil
	}
	if dst == s.cfg.Broadcast {
		reply.SetBroadcast()
	}
	log.Info("proxy DHCP: answering", "type", replyType.String(), "arch", string(arch), "ipxe", ipxe, "boot_file", bootFile)
	return reply, dst
}

// destination is where a reply to req goes (RFC 2131 section 4.1, PXE
// 2.1): through the relay when there is one; on 4011 back to the sender;
// else to the client's address when it has one and did not ask for
// broadcast, and broadcast otherwise.
func (s *Server) destination(req *dhcpv4.DHCPv4, src *net.UDPAddr, p port) *net.UDPAddr {
	switch {
	case !req.GatewayIPAddr.IsUnspecified() && req.GatewayIPAddr.To4() != nil:
		return &net.UDPAddr{IP: req.GatewayIPAddr, Port: 67}
	case p == portPXE:
		return src
	case !req.IsBroadcast() && !req.ClientIPAddr.IsUnspecified() && req.ClientIPAddr.To4() != nil && src != nil:
		return src
	}
	return s.cfg.Broadcast
}

// clientArch maps option 93 to an Arch; absent means BIOS, as on PXE ROMs
// that predate the option.
func clientArch(req *dhcpv4.DHCPv4) (Arch, bool) {
	archs := req.ClientArch()
	if len(archs) == 0 {
		if req.Options.Has(dhcpv4.OptionClientSystemArchitectureType) {
			return "", false // present but malformed
		}
		return ArchBIOS, true
	}
	switch archs[0] {
	case iana.INTEL_X86PC:
		return ArchBIOS, true
	case iana.EFI_X86_64, iana.EFI_BC:
		return ArchUEFIx64, true
	case iana.EFI_ARM64:
		return ArchUEFIARM64, true
	}
	return "", false
}

// archCode is option 93's first code for logs, or -1.
func archCode(req *dhcpv4.DHCPv4) int {
	if archs := req.ClientArch(); len(archs) > 0 {
		return int(archs[0])
	}
	return -1
}

// isIPXE reports whether the client already runs iPXE: user class "iPXE"
// (option 77) or iPXE's encapsulated options (175).
func isIPXE(req *dhcpv4.DHCPv4) bool {
	if req.Options.Has(dhcpv4.GenericOptionCode(175)) {
		return true
	}
	for _, uc := range req.UserClass() {
		if uc == "iPXE" {
			return true
		}
	}
	return false
}

// scriptURL adds mac= to the script URL base.
func scriptURL(base string, mac net.HardwareAddr) string {
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + "mac=" + mac.String()
}
