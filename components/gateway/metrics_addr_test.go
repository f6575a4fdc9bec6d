package gateway

import "testing"

// TestMetricsAddr: a bare port is on loopback; a host given is kept; what
// is no address is refused.
func TestMetricsAddr(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"9464", "127.0.0.1:9464"},
		{":9464", "127.0.0.1:9464"},
		{"127.0.0.1:9464", "127.0.0.1:9464"},
		{"[::1]:9464", "[::1]:9464"},
		{"0.0.0.0:9464", "0.0.0.0:9464"},
		{"localhost", ""},
		{"99999", ""},
	} {
		got, err := metricsAddr(c.in)
		if got != c.want || (c.want == "") != (err != nil) {
			t.Errorf("metricsAddr(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}
