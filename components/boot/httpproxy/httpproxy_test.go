package httpproxy

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/better-compute/bcd/components/agent/dispatch"
)

func TestAllowed(t *testing.T) {
	var c Config
	for addr, ok := range map[string]bool{
		"10.1.2.3": true, "172.16.0.9": true, "192.168.1.1": true, "100.64.0.1": true, "fd00::1": true,
		"127.0.0.1": false, "::1": false, "169.254.169.254": false, "fe80::1": false, "8.8.8.8": false,
		"192.0.2.1": false, "0.0.0.0": false, "224.0.0.1": false, "::ffff:127.0.0.1": false, "2001:db8::1": false,
	} {
		if err := c.Allowed(netip.MustParseAddr(addr)); (err == nil) != ok {
			t.Errorf("Allowed(%s) = %v, want allowed %v", addr, err, ok)
		}
	}
	// Networks that take everything still take no loopback or link-local
	// address.
	all := Config{Networks: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}
	for _, addr := range []string{"127.0.0.1", "::1", "169.254.169.254", "fe80::1", "224.0.0.1", "0.0.0.0"} {
		if all.Allowed(netip.MustParseAddr(addr)) == nil {
			t.Errorf("%s allowed by networks that cover it", addr)
		}
	}
	c.Networks = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	if c.Allowed(netip.MustParseAddr("10.1.2.3")) != nil || c.Allowed(netip.MustParseAddr("10.2.0.1")) == nil {
		t.Error("configured networks are not what is allowed")
	}
}

func TestDecodeRefuses(t *testing.T) {
	for body, want := range map[string]string{
		`{"url":"ftp://10.0.0.1/"}`:                                             "not an http(s) URL",
		`{"url":"http://u:p@10.0.0.1/"}`:                                        "not an http(s) URL",
		`{"url":"http://10.0.0.1/","method":"CONNECT"}`:                         "method",
		`{"url":"http://10.0.0.1/","headers":{"Host":"x"}}`:                     "transport's to set",
		`{"url":"http://10.0.0.1/","headers":{"X-A":"a\r\nX-B: b"}}`:            "line break",
		`{"url":"http://10.0.0.1/","headers":{"A B":"x"}}`:                      "not an HTTP token",
		`{"url":"http://10.0.0.1/","headers":{"X":"1"},"secret_headers":["X"]}`: "both plain and secret",
		`{"url":"http://10.0.0.1/","max_bytes":99999999}`:                       "max_bytes",
		`{"url":"http://10.0.0.1/","nope":1}`:                                   "unknown field",
	} {
		if _, err := Decode([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Decode(%s) = %v, want %q", body, err, want)
		}
	}
}

// TestProxy: a request reaches a site machine with its headers and the
// secret header the gateway holds; the answer comes back bounded;
// redirects are returned; loopback, public and link-local addresses are
// refused before anything is sent, also when a name resolves to them.
func TestProxy(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case "/redirect":
			http.Redirect(w, r, "http://8.8.8.8/", http.StatusFound)
		case "/big":
			w.Write([]byte(strings.Repeat("x", 5000)))
		default:
			w.Header().Set("X-Seen-Auth", r.Header.Get("Authorization"))
			w.Write([]byte("hello " + r.Header.Get("X-Plain")))
		}
	}))
	defer srv.Close()
	const secret = "Basic c2VjcmV0LXZhbHVl"
	c := Config{
		Secret: func(_ context.Context, name string) ([]byte, error) {
			if name != SecretPrefix+"Authorization" {
				t.Errorf("secret %q asked", name)
			}
			return []byte(secret), nil
		},
		dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
		},
	}
	ctx := dispatch.WithCommandID(context.Background(), "cmd_p1")
	run := func(body string) (Answer, error) {
		out, err := c.run(ctx, []byte(body))
		var a Answer
		if err == nil {
			json.Unmarshal(out, &a)
		}
		return a, err
	}
	a, err := run(`{"url":"http://10.9.9.9/redfish/v1","headers":{"X-Plain":"there"},"secret_headers":["Authorization"]}`)
	if err != nil || a.Status != 200 || string(a.Body) != "hello there" || a.Headers["X-Seen-Auth"] != secret || a.Remote != "10.9.9.9:80" {
		t.Fatalf("proxied GET = %+v, %v", a, err)
	}
	if a, err := run(`{"url":"http://10.9.9.9/redirect"}`); err != nil || a.Status != http.StatusFound {
		t.Errorf("a redirect: %+v, %v (it is returned, not followed)", a, err)
	}
	if a, err := run(`{"url":"http://10.9.9.9/big","max_bytes":100}`); err != nil || len(a.Body) != 100 || !a.Truncated {
		t.Errorf("a large answer: %d bytes, truncated %v, %v", len(a.Body), a.Truncated, err)
	}
	before := hits.Load()
	real := Config{} // the real dialer: nothing here may connect
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	for _, u := range []string{"http://127.0.0.1:" + port + "/", "http://localhost:" + port + "/", "http://[::1]:" + port + "/",
		"http://192.0.2.1/", "http://169.254.169.254/latest/meta-data/"} {
		_, err := real.run(ctx, []byte(`{"url":"`+u+`","timeout_seconds":2}`))
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: %v, want a refusal", u, err)
		}
	}
	if hits.Load() != before {
		t.Error("a refused address was reached")
	}
	// A secret value never shows in an error.
	c.Secret = func(context.Context, string) ([]byte, error) { return []byte(secret + "\r\nX-Evil: 1"), nil }
	if _, err := run(`{"url":"http://10.9.9.9/","secret_headers":["Authorization"]}`); err == nil || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Errorf("a secret with a line break: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"url":"http://10.0.0.1/x","method":"POST","headers":{"A":"b"},"secret_headers":["Authorization"],"body":"aGk="}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		body, err := Decode(b)
		if err != nil {
			return
		}
		for k, v := range body.Headers {
			if header(k) != nil || strings.ContainsAny(v, "\r\n") {
				t.Fatalf("accepted header %q: %q", k, v)
			}
		}
		if !methods[body.Method] || len(body.Body) > MaxBody {
			t.Fatalf("accepted %+v", body)
		}
	})
}
