// Package httpproxy is the site agent's site.httpProxy kind: one HTTP
// request to a machine inside the site (a BMC's web interface or API, a
// switch), made by the site on the gateway's behalf, since nothing outside
// the site reaches those addresses. Only site-internal addresses are
// dialled: those of [site] bmc_networks when it is set, else the private
// ranges (RFC 1918, 100.64.0.0/10, fc00::/7); loopback, link-local (cloud
// metadata among them), multicast and public addresses are refused, and
// the check runs on the address actually dialled, so a name that resolves
// elsewhere, or re-resolves, reaches nothing else. Redirects are returned,
// not followed. Header values the operator keeps secret (a BMC's
// Authorization) are fetched from the gateway for this command only
// (SecretRequest, sealed) and never logged or echoed. docs/bmc.md
// describes it.
package httpproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
)

// Kind is the command kind.
const Kind = "site.httpProxy"

// Bounds of a request and its answer.
const (
	MaxBody         = 1 << 20 // a request body
	DefaultMaxBytes = 1 << 20 // an answer body, unless asked otherwise
	MaxMaxBytes     = 8 << 20
	maxTimeout      = 120 * time.Second
	defaultTimeout  = 30 * time.Second
	// SecretPrefix names a secret header: http-header/<Name>.
	SecretPrefix = "http-header/"
)

// Body is site.httpProxy's body.
type Body struct {
	URL     string            `json:"url"`
	Method  string            `json:"method,omitempty"` // GET when empty
	Headers map[string]string `json:"headers,omitempty"`
	// SecretHeaders name headers whose values the gateway holds for this
	// command (bcgw run --secret-header).
	SecretHeaders []string `json:"secret_headers,omitempty"`
	Body          []byte   `json:"body,omitempty"` // base64 in JSON
	MaxBytes      int64    `json:"max_bytes,omitempty"`
	TimeoutSecs   int      `json:"timeout_seconds,omitempty"`
	// InsecureTLS accepts any certificate (BMCs' are mostly self-signed).
	InsecureTLS bool `json:"insecure_tls,omitempty"`
}

// Answer is its output.
type Answer struct {
	Status    int               `json:"status"`
	Headers   map[string]string `json:"headers"`
	Body      []byte            `json:"body"` // base64 in JSON
	Truncated bool              `json:"truncated,omitempty"`
	Remote    string            `json:"remote"`
}

// Config wires the kind.
type Config struct {
	// Networks are the site-internal networks; none: the private ranges.
	Networks []netip.Prefix
	// Secret fetches a secret bound to the running command
	// (session.CommandSecret).
	Secret func(ctx context.Context, name string) ([]byte, error)
	// dial, when set, replaces the network dial once the address passed
	// (tests).
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// private are the site-internal ranges when no networks are configured.
var private = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("fc00::/7"),
}

// Allowed says whether ip may be dialled, and why not.
func (c Config) Allowed(ip netip.Addr) error {
	ip = ip.Unmap()
	switch {
	case !ip.IsValid():
		return errors.New("no address")
	case ip.IsLoopback():
		return fmt.Errorf("%s is a loopback address: the site agent's own host is not a site machine", ip)
	case ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast():
		return fmt.Errorf("%s is link-local (cloud instance metadata lives there)", ip)
	case ip.IsUnspecified() || ip.IsMulticast() || ip.IsInterfaceLocalMulticast():
		return fmt.Errorf("%s is not a unicast address", ip)
	}
	nets := c.Networks
	what := "the private ranges (RFC 1918, 100.64.0.0/10, fc00::/7)"
	if len(nets) > 0 {
		what = "[site] bmc_networks"
	}
	if len(nets) == 0 {
		nets = private
	}
	for _, n := range nets {
		if n.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("%s is not a site-internal address: it is outside %s", ip, what)
}

// hopHeaders are headers a caller may not set: the transport owns them.
var hopHeaders = map[string]bool{"Host": true, "Connection": true, "Content-Length": true, "Transfer-Encoding": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Keep-Alive": true, "Proxy-Authorization": true, "Proxy-Connection": true}

var methods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true}

// Decode reads and checks a body.
func Decode(b []byte) (Body, error) {
	var body Body
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return body, err
	}
	if body.Method == "" {
		body.Method = "GET"
	}
	u, err := url.Parse(body.URL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "":
		return body, fmt.Errorf("url: %q is not an http(s) URL without user info or fragment", clip(body.URL))
	case !methods[body.Method]:
		return body, fmt.Errorf("method %q is not GET, HEAD, POST, PUT, PATCH or DELETE", clip(body.Method))
	case len(body.Body) > MaxBody:
		return body, fmt.Errorf("body: %d bytes; at most %d", len(body.Body), MaxBody)
	case body.MaxBytes < 0 || body.MaxBytes > MaxMaxBytes:
		return body, fmt.Errorf("max_bytes: 0 to %d", MaxMaxBytes)
	case body.TimeoutSecs < 0 || time.Duration(body.TimeoutSecs)*time.Second > maxTimeout:
		return body, fmt.Errorf("timeout_seconds: 0 to %d", int(maxTimeout.Seconds()))
	case len(body.Headers)+len(body.SecretHeaders) > 32:
		return body, errors.New("at most 32 headers")
	}
	for k, v := range body.Headers {
		if err := header(k); err != nil {
			return body, err
		}
		if strings.ContainsAny(v, "\r\n\x00") || len(v) > 8192 {
			return body, fmt.Errorf("header %s: the value has a line break or NUL, or is over 8 KiB", k)
		}
	}
	for _, k := range body.SecretHeaders {
		if err := header(k); err != nil {
			return body, err
		}
		if _, ok := body.Headers[k]; ok {
			return body, fmt.Errorf("header %s is both plain and secret", k)
		}
	}
	return body, nil
}

// header checks a header name: a token, not one the transport owns.
func header(k string) error {
	if k == "" || len(k) > 64 {
		return fmt.Errorf("header name %q: 1 to 64 characters", clip(k))
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Errorf("header name %q is not an HTTP token", clip(k))
		}
	}
	if hopHeaders[http.CanonicalHeaderKey(k)] {
		return fmt.Errorf("header %s is the transport's to set", http.CanonicalHeaderKey(k))
	}
	return nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Kind is site.httpProxy.
func (c Config) Kind() dispatch.Kind {
	return dispatch.Kind{Name: Kind, Lane: dispatch.LaneControl, Run: c.run}
}

func (c Config) run(ctx context.Context, raw []byte) (json.RawMessage, error) {
	body, err := Decode(raw)
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(body.URL)
	// An address in the URL is checked before anything is sent; a name is
	// checked on each address it dials.
	if ip, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err == nil {
		if err := c.Allowed(ip); err != nil {
			return nil, fmt.Errorf("%s refused: %w", Kind, err)
		}
	}
	timeout := defaultTimeout
	if body.TimeoutSecs > 0 {
		timeout = time.Duration(body.TimeoutSecs) * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, body.Method, body.URL, strings.NewReader(string(body.Body)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Kind, err)
	}
	for k, v := range body.Headers {
		req.Header.Set(k, v)
	}
	for _, k := range body.SecretHeaders {
		if c.Secret == nil {
			return nil, fmt.Errorf("%s: no session to fetch the secret header %s", Kind, k)
		}
		v, err := c.Secret(ctx, SecretPrefix+http.CanonicalHeaderKey(k))
		if err != nil {
			return nil, fmt.Errorf("%s: the secret header %s: %w", Kind, k, err)
		}
		if strings.ContainsAny(string(v), "\r\n\x00") {
			return nil, fmt.Errorf("%s: the secret header %s has a line break or NUL", Kind, k)
		}
		req.Header.Set(k, string(v))
	}
	var remote string
	dialer := &net.Dialer{Timeout: 10 * time.Second, Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return err
		}
		if err := c.Allowed(ap.Addr()); err != nil {
			return fmt.Errorf("%s refused: %w", Kind, err)
		}
		remote = address
		return nil
	}}
	dial := dialer.DialContext
	if c.dial != nil {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, _ := net.SplitHostPort(addr)
			ip, err := netip.ParseAddr(host)
			if err != nil {
				return nil, fmt.Errorf("%s: a test dial takes addresses only", Kind)
			}
			if err := c.Allowed(ip); err != nil {
				return nil, fmt.Errorf("%s refused: %w", Kind, err)
			}
			remote = addr
			return c.dial(ctx, network, addr)
		}
	}
	tr := &http.Transport{DialContext: dial, Proxy: nil, ForceAttemptHTTP2: false, MaxIdleConns: 1,
		TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: timeout}
	if body.InsecureTLS {
		tr.TLSClientConfig = insecureTLS()
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s %s: %w", Kind, body.Method, u.Redacted(), unwrapURL(err))
	}
	defer resp.Body.Close()
	limit := body.MaxBytes
	if limit == 0 {
		limit = DefaultMaxBytes
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: reading the answer: %w", Kind, err)
	}
	ans := Answer{Status: resp.StatusCode, Headers: map[string]string{}, Body: b, Remote: remote}
	if int64(len(b)) > limit {
		ans.Body, ans.Truncated = b[:limit], true
	}
	for k, v := range resp.Header {
		ans.Headers[k] = strings.Join(v, ", ")
	}
	return json.Marshal(ans)
}

// unwrapURL drops *url.Error's method and URL (the caller names them).
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
