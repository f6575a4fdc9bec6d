// Package tftpd is the site agent's read-only TFTP server: it hands PXE
// ROMs the iPXE builds (undionly.kpxe, ipxe.efi, snp-arm64.efi) from one
// directory and nothing else.
//
// It is a small RFC 1350 server of our own, read requests in octet mode
// only, with the blksize, tsize and timeout options (RFCs 2347 to 2349).
// pack.ag/tftp's server is not used: a three-byte read request without a
// NUL panics it (datagram.filename slices out of range), which would let
// any machine on the provisioning network stop the site agent. Its client
// is used by the tests.
//
// Files are opened through an os.Root, so a name that climbs out of the
// directory, an absolute name and a symlink that leads outside are all
// refused. Every write request is refused. Transfers are bounded: 64 at
// once, 4 per client address (Config.MaxTransfers, MaxPerSource).
package tftpd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults for the zero values of Config.
const (
	DefaultAddr         = ":69"
	DefaultMaxTransfers = 64
	DefaultMaxPerSource = 4
	DefaultTimeout      = time.Second
	DefaultRetries      = 5
	// DefaultMaxBlockSize keeps a DATA packet inside a 1500-byte
	// Ethernet frame (1500 - 20 IP - 8 UDP - 4 TFTP).
	DefaultMaxBlockSize = 1468
)

// maxRequestLen bounds a read request, as RFC 2347 bounds a request with
// options (512 octets).
const maxRequestLen = 512

// TFTP opcodes.
const (
	opRRQ   = 1
	opWRQ   = 2
	opDATA  = 3
	opACK   = 4
	opERROR = 5
	opOACK  = 6
)

// TFTP error codes (RFC 1350).
const (
	errNotDefined       = 0
	errFileNotFound     = 1
	errAccessViolation  = 2
	errIllegalOperation = 4
	errUnknownTID       = 5
)

// Config configures a Server.
type Config struct {
	// Addr is the UDP address to listen on (default ":69").
	Addr string
	// Root is the directory whose files are served.
	Root string
	// MaxTransfers bounds transfers in progress (default 64).
	MaxTransfers int
	// MaxPerSource bounds transfers in progress per client IP address
	// (default 4).
	MaxPerSource int
	// Timeout is how long to wait for an ACK before sending again
	// (default 1 s); a client's timeout option overrides it.
	Timeout time.Duration
	// Retries is how many times a packet is sent again before the
	// transfer is given up (default 5).
	Retries int
	// MaxBlockSize caps the blksize option (default 1468).
	MaxBlockSize int
	// Log receives the server's records; nil discards them.
	Log *slog.Logger
}

// Server is a read-only TFTP server.
type Server struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	total     int
	perSource map[netip.Addr]int
	active    map[netip.AddrPort]bool
}

// New checks cfg and applies its defaults.
func New(cfg Config) (*Server, error) {
	if cfg.Root == "" {
		return nil, errors.New("creating TFTP server: no root directory")
	}
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.MaxTransfers <= 0 {
		cfg.MaxTransfers = DefaultMaxTransfers
	}
	if cfg.MaxPerSource <= 0 {
		cfg.MaxPerSource = DefaultMaxPerSource
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Retries <= 0 {
		cfg.Retries = DefaultRetries
	}
	if cfg.MaxBlockSize <= 0 {
		cfg.MaxBlockSize = DefaultMaxBlockSize
	}
	if cfg.MaxBlockSize < 8 || cfg.MaxBlockSize > 65464 {
		return nil, errors.New("creating TFTP server: MaxBlockSize must be 8 to 65464")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		cfg:       cfg,
		log:       log.With("component", "tftpd"),
		perSource: map[netip.Addr]int{},
		active:    map[netip.AddrPort]bool{},
	}, nil
}

// Listen opens the server's UDP socket on Config.Addr.
func (s *Server) Listen(ctx context.Context) (net.PacketConn, error) {
	var lc net.ListenConfig
	conn, err := lc.ListenPacket(ctx, "udp4", s.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listening for TFTP on %s: %w", s.cfg.Addr, err)
	}
	return conn, nil
}

// Serve listens on Config.Addr and serves until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	conn, err := s.Listen(ctx)
	if err != nil {
		return err
	}
	return s.ServeConn(ctx, conn)
}

// ServeConn serves read requests arriving on conn until ctx ends, then
// closes conn and waits for the transfers in progress to stop.
func (s *Server) ServeConn(ctx context.Context, conn net.PacketConn) error {
	root, err := os.OpenRoot(s.cfg.Root)
	if err != nil {
		conn.Close()
		return fmt.Errorf("serving TFTP: opening root %s: %w", s.cfg.Root, err)
	}
	defer root.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	var localIP net.IP
	if ua, ok := conn.LocalAddr().(*net.UDPAddr); ok && !ua.IP.IsUnspecified() {
		localIP = ua.IP
	}
	var wg sync.WaitGroup
	defer func() {
		cancel() // ends the transfers in progress
		wg.Wait()
	}()

	s.log.Info("TFTP server listening", "addr", conn.LocalAddr().String(), "root", s.cfg.Root)
	buf := make([]byte, 2048)
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
			return fmt.Errorf("serving TFTP: reading from %s: %w", conn.LocalAddr(), err)
		}
		ua, ok := addr.(*net.UDPAddr)
		if !ok {
			continue
		}
		client := ua.AddrPort()
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
		s.handle(ctx, conn, root, localIP, buf[:n], client, &wg)
	}
}

// handle answers one packet that arrived on the server's port.
func (s *Server) handle(ctx context.Context, conn net.PacketConn, root *os.Root, localIP net.IP, pkt []byte, client netip.AddrPort, wg *sync.WaitGroup) {
	if len(pkt) < 2 {
		return
	}
	log := s.log.With("client", client.String())
	reply := func(code uint16, msg string) {
		_, _ = conn.WriteTo(errorPacket(code, msg), net.UDPAddrFromAddrPort(client))
	}
	switch binary.BigEndian.Uint16(pkt) {
	case opWRQ:
		log.Warn("TFTP write request refused")
		reply(errAccessViolation, "this server is read-only")
		return
	case opRRQ:
	default:
		return // a stray DATA, ACK, ERROR or junk: no answer
	}
	req, err := parseRequest(pkt)
	if err != nil {
		log.Warn("TFTP read request refused", "err", err)
		reply(errIllegalOperation, err.Error())
		return
	}
	log = log.With("file", req.name)
	switch s.acquire(client) {
	case slotDuplicate:
		return // the client sent its request again; its transfer runs
	case slotBusy:
		log.Warn("TFTP read request refused: too many transfers")
		reply(errNotDefined, "too many transfers, try again later")
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer s.release(client)
		s.transfer(ctx, root, localIP, req, client, log)
	}()
}

// The outcomes of acquire.
const (
	slotTaken     = iota
	slotDuplicate // a transfer to this client address and port runs already
	slotBusy      // the total or per-source bound is reached
)

// acquire takes a transfer slot for client. A retransmitted request from
// a client whose transfer is already running takes none.
func (s *Server) acquire(client netip.AddrPort) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active[client] {
		return slotDuplicate
	}
	if s.total >= s.cfg.MaxTransfers || s.perSource[client.Addr()] >= s.cfg.MaxPerSource {
		return slotBusy
	}
	s.total++
	s.perSource[client.Addr()]++
	s.active[client] = true
	return slotTaken
}

func (s *Server) release(client netip.AddrPort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.perSource[client.Addr()]--; s.perSource[client.Addr()] <= 0 {
		delete(s.perSource, client.Addr())
	}
	delete(s.active, client)
}

// request is a parsed read request.
type request struct {
	name    string
	blksize int // 0: not asked
	tsize   bool
	timeout int // seconds; 0: not asked
}

// parseRequest parses an RRQ: opcode, file name, NUL, mode, NUL, then
// option name and value pairs each ended by a NUL.
func parseRequest(pkt []byte) (request, error) {
	var r request
	if len(pkt) > maxRequestLen {
		return r, fmt.Errorf("request longer than %d bytes", maxRequestLen)
	}
	if len(pkt) < 4 || binary.BigEndian.Uint16(pkt) != opRRQ {
		return r, errors.New("not a read request")
	}
	body := pkt[2:]
	if body[len(body)-1] != 0 {
		return r, errors.New("malformed request: not NUL-terminated")
	}
	fields := bytes.Split(body[:len(body)-1], []byte{0})
	if len(fields) < 2 || len(fields)%2 != 0 {
		return r, errors.New("malformed request: want name, mode and option pairs")
	}
	r.name = string(fields[0])
	if err := checkName(r.name); err != nil {
		return r, err
	}
	if mode := strings.ToLower(string(fields[1])); mode != "octet" {
		return r, errors.New("only octet mode is served")
	}
	for i := 2; i < len(fields); i += 2 {
		name, value := strings.ToLower(string(fields[i])), string(fields[i+1])
		n, err := strconv.Atoi(value)
		if err != nil {
			continue // an option we cannot read is ignored (RFC 2347)
		}
		switch name {
		case "blksize":
			if n >= 8 && n <= 65464 {
				r.blksize = n
			}
		case "tsize":
			if n == 0 {
				r.tsize = true
			}
		case "timeout":
			if n >= 1 && n <= 255 {
				r.timeout = n
			}
		}
	}
	return r, nil
}

// checkName accepts a relative, local file name: no empty name, no
// leading /, no .. element, no backslash or control character.
func checkName(name string) error {
	if name == "" {
		return errors.New("empty file name")
	}
	if len(name) > 255 {
		return errors.New("file name longer than 255 bytes")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return errors.New("file name has a control character or backslash")
		}
	}
	if !filepath.IsLocal(name) {
		return errors.New("file name is absolute or climbs out of the root")
	}
	return nil
}

// transfer sends one file to client from a new socket (the transfer ID).
func (s *Server) transfer(ctx context.Context, root *os.Root, localIP net.IP, req request, client netip.AddrPort, log *slog.Logger) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: localIP})
	if err != nil {
		log.Error("TFTP transfer: opening a socket", "err", err)
		return
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	peer := net.UDPAddrFromAddrPort(client)
	sendError := func(code uint16, msg string) { _, _ = conn.WriteToUDP(errorPacket(code, msg), peer) }

	f, err := root.Open(req.name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			log.Info("TFTP read request: no such file")
			sendError(errFileNotFound, "file not found")
		} else {
			log.Warn("TFTP read request refused", "err", err)
			sendError(errAccessViolation, "access violation")
		}
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || !info.Mode().IsRegular() {
		log.Warn("TFTP read request refused: not a regular file")
		sendError(errFileNotFound, "file not found")
		return
	}

	t := &sender{
		conn:    conn,
		peer:    client,
		timeout: s.cfg.Timeout,
		retries: s.cfg.Retries,
		blksize: 512,
		buf:     make([]byte, 2048),
	}
	oack := map[string]string{}
	if req.blksize > 0 {
		t.blksize = min(req.blksize, s.cfg.MaxBlockSize)
		oack["blksize"] = strconv.Itoa(t.blksize)
	}
	if req.tsize {
		oack["tsize"] = strconv.FormatInt(info.Size(), 10)
	}
	if req.timeout > 0 {
		t.timeout = time.Duration(req.timeout) * time.Second
		oack["timeout"] = strconv.Itoa(req.timeout)
	}
	if len(oack) > 0 {
		if err := t.exchange(oackPacket(oack), 0); err != nil {
			log.Warn("TFTP transfer failed at option acknowledgement", "err", err)
			return
		}
	}

	data := make([]byte, 4+t.blksize)
	binary.BigEndian.PutUint16(data, opDATA)
	var sent int64
	for block := uint16(1); ; block++ {
		n, err := io.ReadFull(f, data[4:])
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			log.Error("TFTP transfer: reading the file", "err", err)
			sendError(errNotDefined, "read error")
			return
		}
		binary.BigEndian.PutUint16(data[2:], block)
		if err := t.exchange(data[:4+n], block); err != nil {
			log.Warn("TFTP transfer failed", "err", err, "bytes", sent)
			return
		}
		sent += int64(n)
		if n < t.blksize {
			break
		}
	}
	log.Info("TFTP transfer done", "bytes", sent, "blksize", t.blksize)
}

// sender runs the lock-step send and wait of one transfer.
type sender struct {
	conn    *net.UDPConn
	peer    netip.AddrPort
	timeout time.Duration
	retries int
	blksize int
	buf     []byte
}

// errAborted: the client sent an ERROR packet.
var errAborted = errors.New("the client aborted the transfer")

// exchange sends pkt and waits for the ACK of block, sending pkt again
// after each timeout. Packets from another address get an ERROR
// (unknown transfer ID); duplicate ACKs of earlier blocks are ignored, so
// a delayed ACK never makes a block go out twice.
func (t *sender) exchange(pkt []byte, block uint16) error {
	peer := net.UDPAddrFromAddrPort(t.peer)
	for try := 0; try <= t.retries; try++ {
		if _, err := t.conn.WriteToUDP(pkt, peer); err != nil {
			return fmt.Errorf("sending block %d: %w", block, err)
		}
		deadline := time.Now().Add(t.timeout)
		for {
			if err := t.conn.SetReadDeadline(deadline); err != nil {
				return fmt.Errorf("waiting for the ACK of block %d: %w", block, err)
			}
			n, from, err := t.conn.ReadFromUDPAddrPort(t.buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break // send again
				}
				return fmt.Errorf("waiting for the ACK of block %d: %w", block, err)
			}
			from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
			if from != t.peer {
				_, _ = t.conn.WriteToUDPAddrPort(errorPacket(errUnknownTID, "unknown transfer ID"), from)
				continue
			}
			if n < 4 {
				continue
			}
			switch binary.BigEndian.Uint16(t.buf) {
			case opACK:
				if binary.BigEndian.Uint16(t.buf[2:]) == block {
					return nil
				}
			case opERROR:
				return errAborted
			}
		}
	}
	return fmt.Errorf("no ACK of block %d after %d tries", block, t.retries+1)
}

// errorPacket builds an ERROR packet.
func errorPacket(code uint16, msg string) []byte {
	p := make([]byte, 4, 5+len(msg))
	binary.BigEndian.PutUint16(p, opERROR)
	binary.BigEndian.PutUint16(p[2:], code)
	p = append(p, msg...)
	return append(p, 0)
}

// oackPacket builds an OACK packet with the options in a fixed order.
func oackPacket(opts map[string]string) []byte {
	p := []byte{0, opOACK}
	for _, name := range []string{"blksize", "tsize", "timeout"} {
		if v, ok := opts[name]; ok {
			p = append(p, name...)
			p = append(p, 0)
			p = append(p, v...)
			p = append(p, 0)
		}
	}
	return p
}
