package tftpd

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pack.ag/tftp"
)

// fixture is a served root and a server on 127.0.0.1.
type fixture struct {
	root   string
	secret string // a file beside the root, never to be served
	addr   *net.UDPAddr
}

func start(t *testing.T, cfg Config) *fixture {
	t.Helper()
	base := t.TempDir()
	f := &fixture{root: filepath.Join(base, "root"), secret: filepath.Join(base, "secret")}
	must(t, os.MkdirAll(filepath.Join(f.root, "sub"), 0o755))
	must(t, os.WriteFile(f.secret, []byte("do not serve"), 0o644))
	cfg.Root = f.root
	cfg.Addr = "127.0.0.1:0"
	s, err := New(cfg)
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := s.Listen(ctx)
	must(t, err)
	f.addr = conn.LocalAddr().(*net.UDPAddr)
	done := make(chan error, 1)
	go func() { done <- s.ServeConn(ctx, conn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeConn: %v", err)
		}
	})
	return f
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) url(name string) string { return fmt.Sprintf("tftp://%s/%s", f.addr, name) }

// get reads name with pack.ag/tftp's client.
func (f *fixture) get(name string, opts ...tftp.ClientOpt) ([]byte, error) {
	c, err := tftp.NewClient(append([]tftp.ClientOpt{tftp.ClientRetransmit(2)}, opts...)...)
	if err != nil {
		return nil, err
	}
	resp, err := c.Get(f.url(name))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(resp)
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

func TestRead(t *testing.T) {
	f := start(t, Config{})
	files := map[string][]byte{
		"undionly.kpxe": pattern(70 * 1024),
		"exact.bin":     pattern(3 * 512),
		"empty":         nil,
		"sub/ipxe.efi":  pattern(1 << 20),
	}
	for name, b := range files {
		must(t, os.WriteFile(filepath.Join(f.root, name), b, 0o644))
	}
	must(t, os.Symlink("sub/ipxe.efi", filepath.Join(f.root, "link.efi")))

	for _, tc := range []struct {
		name string
		want []byte
		opts []tftp.ClientOpt
	}{
		{"undionly.kpxe", files["undionly.kpxe"], nil},
		{"exact.bin", files["exact.bin"], nil},
		{"empty", nil, nil},
		{"sub/ipxe.efi", files["sub/ipxe.efi"], []tftp.ClientOpt{tftp.ClientBlocksize(1432)}},
		{"exact.bin", files["exact.bin"], []tftp.ClientOpt{tftp.ClientBlocksize(512), tftp.ClientTimeout(2)}},
		{"link.efi", files["sub/ipxe.efi"], []tftp.ClientOpt{tftp.ClientBlocksize(8192)}},
		{"undionly.kpxe", files["undionly.kpxe"], []tftp.ClientOpt{tftp.ClientTransferSize(false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := f.get(tc.name, tc.opts...)
			if err != nil {
				t.Fatalf("get %s: %v", tc.name, err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Errorf("get %s: %d bytes, want %d", tc.name, len(got), len(tc.want))
			}
		})
	}
}

func TestRefused(t *testing.T) {
	f := start(t, Config{})
	must(t, os.WriteFile(filepath.Join(f.root, "ok"), []byte("ok"), 0o644))
	must(t, os.Symlink(f.secret, filepath.Join(f.root, "out-abs")))
	must(t, os.Symlink("../secret", filepath.Join(f.root, "out-rel")))
	must(t, os.Symlink("..", filepath.Join(f.root, "sub", "up")))
	for _, name := range []string{
		"../secret",
		"sub/../../secret",
		"out-abs",
		"out-rel",
		"sub/up/secret",
		"sub",
		"missing",
	} {
		t.Run(name, func(t *testing.T) {
			got, err := f.get(name)
			if err == nil {
				t.Fatalf("get %s: served %q", name, got)
			}
		})
	}
	// Names pack.ag's client cannot send (it strips a leading /), sent raw.
	for _, name := range []string{f.secret, "/etc/passwd", `..\secret`, "a\x01b"} {
		t.Run("raw "+name, func(t *testing.T) {
			c := dialRaw(t, f)
			c.send(rrq(name, "octet"))
			code, _ := c.expectError()
			if code != errIllegalOperation {
				t.Errorf("error code %d, want %d", code, errIllegalOperation)
			}
		})
	}
}

func TestWriteRefused(t *testing.T) {
	f := start(t, Config{})
	c, err := tftp.NewClient(tftp.ClientRetransmit(2))
	must(t, err)
	err = c.Put(f.url("uploaded"), strings.NewReader("payload"), 7)
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("Put: %v, want a read-only refusal", err)
	}
	if _, err := os.Stat(filepath.Join(f.root, "uploaded")); !os.IsNotExist(err) {
		t.Errorf("the upload exists: %v", err)
	}
	// Over an existing file too.
	must(t, os.WriteFile(filepath.Join(f.root, "ipxe.efi"), []byte("original"), 0o644))
	if err := c.Put(f.url("ipxe.efi"), strings.NewReader("evil"), 4); err == nil {
		t.Fatal("Put over an existing file succeeded")
	}
	if b, _ := os.ReadFile(filepath.Join(f.root, "ipxe.efi")); string(b) != "original" {
		t.Errorf("ipxe.efi is now %q", b)
	}
}

// TestMalformedRequests: what crashes pack.ag/tftp's server (an RRQ
// without a NUL) and other junk get an error or no answer, and the server
// goes on serving.
func TestMalformedRequests(t *testing.T) {
	f := start(t, Config{})
	must(t, os.WriteFile(filepath.Join(f.root, "ok"), []byte("ok"), 0o644))
	for _, pkt := range [][]byte{
		{0, 1, 'a'},
		{0, 1, 0},
		{0, 1},
		{0},
		{0, 1, 'a', 0, 'o', 'c', 't', 'e', 't'},
		{0, 1, 'a', 0, 0},
		rrq("ok", "netascii"),
		rrq("ok", "mail"),
		append(rrq("ok", "octet"), bytes.Repeat([]byte("x\x00"), 300)...),
		{0, 3, 0, 1, 'd'},
		{0, 4, 0, 1},
		{0, 9, 1, 2, 3},
		{0, 5, 0, 0, 0},
	} {
		c := dialRaw(t, f)
		c.send(pkt)
	}
	got, err := f.get("ok")
	if err != nil || string(got) != "ok" {
		t.Fatalf("after junk: %q, %v", got, err)
	}
	c := dialRaw(t, f)
	c.send(rrq("ok", "netascii"))
	if _, msg := c.expectError(); !strings.Contains(msg, "octet") {
		t.Errorf("netascii refusal says %q", msg)
	}
}

// TestBounds: at most MaxPerSource transfers per client address and
// MaxTransfers in all; a finished transfer frees its slot.
func TestBounds(t *testing.T) {
	for _, tc := range []struct {
		name              string
		total, perSource  int
		busyAfter         int
		wantErrorContains string
	}{
		{"per source", 64, 4, 4, "too many"},
		{"total", 3, 4, 3, "too many"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, Config{MaxTransfers: tc.total, MaxPerSource: tc.perSource, Timeout: 5 * time.Second})
			must(t, os.WriteFile(filepath.Join(f.root, "big"), pattern(10000), 0o644))
			var held []*rawClient
			for range tc.busyAfter {
				c := dialRaw(t, f)
				c.send(rrq("big", "octet"))
				c.expectData(1) // the transfer runs, waiting for an ACK
				held = append(held, c)
			}
			c := dialRaw(t, f)
			c.send(rrq("big", "octet"))
			if _, msg := c.expectError(); !strings.Contains(msg, tc.wantErrorContains) {
				t.Fatalf("over the bound: error %q", msg)
			}
			// Abort one held transfer; its slot comes back.
			held[0].sendTo(held[0].tid, errorPacket(errNotDefined, "bye"))
			deadline := time.Now().Add(5 * time.Second)
			for {
				c := dialRaw(t, f)
				c.send(rrq("big", "octet"))
				op, _ := c.read()
				if op == opDATA {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the slot never came back")
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestLockStep: a lost ACK makes the block go out again; a repeated RRQ
// does not start a second transfer; a duplicate ACK sends nothing; a
// packet from another port gets "unknown transfer ID".
func TestLockStep(t *testing.T) {
	f := start(t, Config{Timeout: 200 * time.Millisecond})
	content := pattern(512 + 100)
	must(t, os.WriteFile(filepath.Join(f.root, "two-blocks"), content, 0o644))
	c := dialRaw(t, f)
	c.send(rrq("two-blocks", "octet"))
	first := c.expectData(1)
	c.send(rrq("two-blocks", "octet")) // repeated request: no second transfer
	again := c.expectData(1)           // the retransmission after the timeout
	if !bytes.Equal(first, again) || !bytes.Equal(first, content[:512]) {
		t.Fatal("block 1 differs between sends or from the file")
	}

	intruder := dialRaw(t, f)
	intruder.sendTo(c.tid, ack(1))
	if code, _ := intruder.expectError(); code != errUnknownTID {
		t.Errorf("intruder got error %d, want %d", code, errUnknownTID)
	}

	c.sendTo(c.tid, ack(1))
	second := c.expectData(2)
	if !bytes.Equal(second, content[512:]) {
		t.Fatal("block 2 differs from the file")
	}
	c.sendTo(c.tid, ack(2))
	// Nothing more comes (no second transfer, no extra block).
	c.conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, _, err := c.conn.ReadFromUDP(make([]byte, 1024)); err == nil {
		t.Errorf("unexpected %d-byte packet after the last ACK", n)
	}
}

func TestParseRequest(t *testing.T) {
	r, err := parseRequest(append(rrq("ipxe.efi", "OCTET"), opt("BLKSIZE", "1432", "tsize", "0", "timeout", "3", "windowsize", "8")...))
	if err != nil {
		t.Fatal(err)
	}
	if r != (request{name: "ipxe.efi", blksize: 1432, tsize: true, timeout: 3}) {
		t.Errorf("parseRequest = %+v", r)
	}
	r, err = parseRequest(append(rrq("a", "octet"), opt("blksize", "4", "timeout", "x")...))
	if err != nil || r.blksize != 0 || r.timeout != 0 {
		t.Errorf("out-of-range options: %+v, %v", r, err)
	}
	if _, err := parseRequest(append(rrq("a", "octet"), 'x', 0)); err == nil {
		t.Error("an option without a value was accepted")
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(rrq("undionly.kpxe", "octet"))
	f.Add(append(rrq("ipxe.efi", "octet"), opt("blksize", "1432", "tsize", "0")...))
	f.Add([]byte{0, 1, 'a'})
	f.Add([]byte{0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, pkt []byte) {
		r, err := parseRequest(pkt)
		if err != nil {
			return
		}
		if checkName(r.name) != nil || !filepath.IsLocal(r.name) {
			t.Fatalf("accepted name %q", r.name)
		}
		if r.blksize != 0 && (r.blksize < 8 || r.blksize > 65464) {
			t.Fatalf("accepted blksize %d", r.blksize)
		}
	})
}

// rawClient speaks TFTP by hand, for what pack.ag's client cannot do.
type rawClient struct {
	t    *testing.T
	conn *net.UDPConn
	srv  *net.UDPAddr
	tid  *net.UDPAddr // the server's transfer address, once known
}

func dialRaw(t *testing.T, f *fixture) *rawClient {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	must(t, err)
	t.Cleanup(func() { conn.Close() })
	return &rawClient{t: t, conn: conn, srv: f.addr}
}

func (c *rawClient) send(p []byte) { c.sendTo(c.srv, p) }

func (c *rawClient) sendTo(a *net.UDPAddr, p []byte) {
	c.t.Helper()
	if _, err := c.conn.WriteToUDP(p, a); err != nil {
		c.t.Fatal(err)
	}
}

// read returns the next packet's opcode and body (after the opcode), or 0
// after 3 s of silence.
func (c *rawClient) read() (uint16, []byte) {
	buf := make([]byte, 70000)
	c.conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, from, err := c.conn.ReadFromUDP(buf)
	if err != nil || n < 2 {
		return 0, nil
	}
	if from.Port != c.srv.Port {
		c.tid = from
	}
	return binary.BigEndian.Uint16(buf), buf[2:n]
}

func (c *rawClient) expectData(block uint16) []byte {
	c.t.Helper()
	op, body := c.read()
	if op != opDATA || len(body) < 2 || binary.BigEndian.Uint16(body) != block {
		c.t.Fatalf("want DATA %d, got opcode %d %q", block, op, body)
	}
	return body[2:]
}

func (c *rawClient) expectError() (uint16, string) {
	c.t.Helper()
	op, body := c.read()
	if op != opERROR || len(body) < 3 {
		c.t.Fatalf("want ERROR, got opcode %d %q", op, body)
	}
	return binary.BigEndian.Uint16(body), strings.TrimRight(string(body[2:]), "\x00")
}

func rrq(name, mode string) []byte {
	p := []byte{0, opRRQ}
	p = append(p, name...)
	p = append(p, 0)
	p = append(p, mode...)
	return append(p, 0)
}

func opt(kv ...string) []byte {
	var p []byte
	for _, s := range kv {
		p = append(p, s...)
		p = append(p, 0)
	}
	return p
}

func ack(block uint16) []byte { return []byte{0, opACK, byte(block >> 8), byte(block)} }
