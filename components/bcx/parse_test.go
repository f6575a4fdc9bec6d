package bcx

import (
	"crypto/tls"
	"encoding/base64"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParsePins(t *testing.T) {
	h := strings.Repeat("ab", 32)
	for _, c := range []struct {
		name, in string
		n        int
		err      string
	}{
		{"sha256sum output", h + "  bcx-ipmi\n", 1, ""},
		{"binary mark, comments, blanks, tabs", "# pins\n\n" + h + "\t*bcx-ipmi\n" + strings.Repeat("01", 32) + " bcx-x-2\n", 2, ""},
		{"short hash", "abcd  bcx-ipmi\n", 0, "64 hex"},
		{"not hex", strings.Repeat("zz", 32) + "  bcx-ipmi\n", 0, "64 hex"},
		{"no bcx- prefix", h + "  ipmi\n", 0, "bcx-<driver id>"},
		{"path", h + "  ../bcx-ipmi\n", 0, "bcx-<driver id>"},
		{"upper case", h + "  bcx-IPMI\n", 0, "bcx-<driver id>"},
		{"three fields", h + "  bcx-ipmi extra\n", 0, "want"},
		{"twice", h + "  bcx-ipmi\n" + h + "  bcx-ipmi\n", 0, "pinned twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pins, err := ParsePins([]byte(c.in))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || len(pins) != c.n {
				t.Fatalf("%v %v", pins, err)
			}
			if pins[0].DriverID() != "ipmi" {
				t.Fatalf("driver %q", pins[0].DriverID())
			}
		})
	}
}

func TestParseHandshake(t *testing.T) {
	cert, err := newCert("t")
	if err != nil {
		t.Fatal(err)
	}
	good := Handshake{Core: 1, Protocol: 1, Socket: "/run/x/plugin.sock", Cert: cert.Leaf}.Line()
	der := base64.RawStdEncoding.EncodeToString(cert.Leaf.Raw)
	for _, c := range []struct{ name, line, dir, err string }{
		{"good", good + "\n", "/run/x", ""},
		{"good, no dir check", good, "", ""},
		{"other dir", good, "/run/y", "not in the directory"},
		{"core 2", "2|1|unix|/run/x/plugin.sock|grpc|" + der, "", "core version"},
		{"protocol 2", "1|2|unix|/run/x/plugin.sock|grpc|" + der, "", "protocol version"},
		{"tcp", "1|1|tcp|127.0.0.1:1|grpc|" + der, "", "unix"},
		{"netrpc", "1|1|unix|/run/x/plugin.sock|netrpc|" + der, "", "grpc"},
		{"relative", "1|1|unix|plugin.sock|grpc|" + der, "", "absolute"},
		{"dotdot", "1|1|unix|/run/x/../y/plugin.sock|grpc|" + der, "", "clean"},
		{"bad base64", "1|1|unix|/run/x/plugin.sock|grpc|!!", "", "base64"},
		{"not a cert", "1|1|unix|/run/x/plugin.sock|grpc|AAAA", "", "certificate"},
		{"five fields", "1|1|unix|/run/x/plugin.sock|grpc", "", "fields"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := ParseHandshake(c.line, c.dir)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || h.Socket != "/run/x/plugin.sock" || !h.Cert.Equal(cert.Leaf) {
				t.Fatalf("%+v %v", h, err)
			}
		})
	}
}

// TestPinnedTLS: each side accepts only the other's pinned certificate.
func TestPinnedTLS(t *testing.T) {
	host, _ := newCert("host")
	plug, _ := newCert("plugin")
	other, _ := newCert("other")
	handshake := func(client, server *tls.Config) (cerr, serr error) {
		a, b := net.Pipe()
		a.SetDeadline(time.Now().Add(2 * time.Second))
		b.SetDeadline(time.Now().Add(2 * time.Second))
		done := make(chan error, 1)
		go func() { s := tls.Server(b, server); done <- s.Handshake(); b.Close() }()
		c := tls.Client(a, client)
		cerr = c.Handshake()
		a.Close()
		return cerr, <-done
	}
	if c, s := handshake(clientTLS(host, plug.Leaf.Raw), serverTLS(plug, host.Leaf.Raw)); c != nil || s != nil {
		t.Fatalf("pinned pair: client %v, server %v", c, s)
	}
	// A client with another certificate: the plugin refuses it.
	if _, s := handshake(clientTLS(other, plug.Leaf.Raw), serverTLS(plug, host.Leaf.Raw)); s == nil {
		t.Fatal("the plugin accepted a client certificate that is not the host's")
	}
	// A server with another certificate: the host refuses it.
	if c, _ := handshake(clientTLS(host, plug.Leaf.Raw), serverTLS(other, host.Leaf.Raw)); c == nil {
		t.Fatal("the host accepted a plugin certificate that is not the pinned one")
	}
	// No client certificate at all.
	noCert := clientTLS(host, plug.Leaf.Raw)
	noCert.Certificates = nil
	if _, s := handshake(noCert, serverTLS(plug, host.Leaf.Raw)); s == nil {
		t.Fatal("the plugin accepted a client without a certificate")
	}
}
