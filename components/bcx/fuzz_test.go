package bcx

import (
	"strings"
	"testing"
)

// FuzzParsePins: any bytes either parse into valid pins or fail; nothing
// panics, and every name parsed is bcx-<driver id>.
func FuzzParsePins(f *testing.F) {
	f.Add([]byte(strings.Repeat("ab", 32) + "  bcx-ipmi\n"))
	f.Add([]byte("# c\n\n" + strings.Repeat("01", 32) + "\t*bcx-a-b\n"))
	f.Add([]byte("zz  ../x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		pins, err := ParsePins(b)
		if err != nil {
			return
		}
		for _, p := range pins {
			if !strings.HasPrefix(p.Name, PluginPrefix) || !ValidDriverID(p.DriverID()) || strings.ContainsAny(p.Name, "/\x00") {
				t.Fatalf("parsed a bad name %q", p.Name)
			}
		}
	})
}

// FuzzParseHandshake: a plugin's first line (untrusted bytes) either parses
// into a socket inside the given directory and a certificate, or fails.
func FuzzParseHandshake(f *testing.F) {
	cert, _ := newCert("f")
	f.Add(Handshake{Core: 1, Protocol: 1, Socket: "/run/x/plugin.sock", Cert: cert.Leaf}.Line())
	f.Add("1|1|unix|/run/x/plugin.sock|grpc|AAAA")
	f.Add("1|1|unix|/run/x/../../etc/plugin.sock|grpc|")
	f.Fuzz(func(t *testing.T, line string) {
		h, err := ParseHandshake(line, "/run/x")
		if err != nil {
			return
		}
		if h.Cert == nil || !strings.HasPrefix(h.Socket, "/run/x/") || strings.Count(h.Socket, "/") != 3 {
			t.Fatalf("accepted %+v", h)
		}
	})
}
