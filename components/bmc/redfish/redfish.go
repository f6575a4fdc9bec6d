// Package redfish is the site agent's Redfish client: power, boot device,
// inspection, CD virtual media, firmware inventory, credential rotation and
// BIOS settings on one BMC.
//
// The client trusts a BMC only by its enrolled SPKI pin: the TLS handshake
// accepts the leaf certificate whose SubjectPublicKeyInfo hashes to the pin,
// whatever its issuer or names (BMC certificates are self-signed), and no
// other. Every resource it requests stays under /redfish/v1 on that BMC: a
// link (an @odata.id, an action target, a Location header or a redirect) that
// leaves /redfish/v1 or names another host is refused, never followed.
// Response bodies are bounded by MaxBody. Errors carry the BMC's Redfish
// message when it sent one, with the passwords and the session token
// removed. Vendor quirks live in quirks.go.
package redfish

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/better-compute/bcd/components/trust/pki"
)

// Root is the Redfish service root; every path the client requests is under it.
const Root = "/redfish/v1"

// MaxBody bounds a response body the client reads.
const MaxBody = 4 << 20

// DefaultTimeout bounds one request when Client.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// maxMembers bounds the members the client reads from one collection, and
// maxPages the Members@odata.nextLink pages it follows.
const (
	maxMembers = 256
	maxPages   = 16
)

// ErrPinMismatch is returned (wrapped) when the BMC's certificate does not
// carry the enrolled SPKI pin.
var ErrPinMismatch = errors.New("the BMC's certificate does not match the enrolled SPKI pin")

// ErrOutsideRoot is returned (wrapped) for a link that leaves /redfish/v1 or
// names another host.
var ErrOutsideRoot = errors.New("link leaves " + Root + " on this BMC")

// Client talks to one BMC. Fill the exported fields, call operations, then
// Close to end the session. A Client is not safe for concurrent use.
//
// The client keeps references to Username and Password, never copies in
// memory it keeps after Close; the caller owns and zeroes them.
type Client struct {
	Addr     string // host[:port]; port 443 when absent
	SPKIPin  string // sha256/<base64> of the BMC's SubjectPublicKeyInfo
	Username []byte
	Password []byte
	SystemID string        // the system under /redfish/v1/Systems/<id>; empty for the first member
	Timeout  time.Duration // per request; DefaultTimeout when zero
	// LegacyTLS also offers TLS 1.2 with RSA key exchange (no forward
	// secrecy), which old BMCs need. It is a per-BMC enrolment option, off
	// by default; the pin is checked all the same.
	LegacyTLS bool
	// PowerOffWait and PowerPoll bound and pace the wait for Off in a power
	// cycle of a system without PowerCycle (DefaultPowerOffWait and
	// DefaultPowerPoll when zero).
	PowerOffWait, PowerPoll time.Duration

	host    string // normalized host:port
	tlsConf *tls.Config
	hc      *http.Client

	loggedIn    bool
	basic       bool
	token       string
	sessionPath string

	root      *serviceRoot
	system    string // resolved path of the system
	redactAlt [][]byte
}

// NormalizeAddr returns addr as host:port (port 443 when absent, IPv6
// literals bracketed) and its host. It refuses empty hosts, paths, user
// information and characters that do not belong in an address.
func NormalizeAddr(addr string) (hostport, host string, err error) {
	if addr == "" || len(addr) > 255 {
		return "", "", errors.New("address: empty or too long")
	}
	if strings.ContainsAny(addr, "/@?#\\ \t\r\n%") {
		return "", "", errors.New("address: must be host[:port] (no scheme, path, zone or user)")
	}
	host, port := addr, "443"
	if h, p, err := net.SplitHostPort(addr); err == nil {
		host, port = h, p
	} else if ip := net.ParseIP(strings.Trim(addr, "[]")); ip != nil && strings.Contains(addr, ":") {
		host = ip.String() // a bare IPv6 literal
	} else if strings.Contains(addr, ":") {
		return "", "", errors.New("address: must be host[:port]")
	}
	if host == "" {
		return "", "", errors.New("address: empty host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return "", "", errors.New("address: port must be 1-65535")
	}
	for _, r := range host {
		if !(r == '.' || r == '-' || r == ':' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return "", "", errors.New("address: host must be an IP address or a DNS name")
		}
	}
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	} else if strings.Contains(host, ":") {
		return "", "", errors.New("address: host must be an IP address or a DNS name")
	} else {
		host = strings.ToLower(host)
	}
	return net.JoinHostPort(host, port), host, nil
}

// ValidSystemID reports whether id can name a system: one path segment of
// letters, digits and -._~: , at most 128 bytes.
func ValidSystemID(id string) bool {
	if id == "" || len(id) > 128 || id == "." || id == ".." {
		return false
	}
	for _, r := range id {
		if !(r == '-' || r == '.' || r == '_' || r == '~' || r == ':' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

func (c *Client) init() error {
	if c.hc != nil {
		return nil
	}
	host, _, err := NormalizeAddr(c.Addr)
	if err != nil {
		return fmt.Errorf("redfish: %w", err)
	}
	want, err := pki.ParsePin(c.SPKIPin)
	if err != nil {
		return fmt.Errorf("redfish: spki pin: %w", err)
	}
	if c.SystemID != "" && !ValidSystemID(c.SystemID) {
		return errors.New("redfish: system id must be one path segment of letters, digits and -._~:")
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	c.host = host
	c.tlsConf = pinnedTLS(want, c.LegacyTLS)
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                  nil, // BMCs are reached directly, never through an environment proxy
		DialContext:            dialer.DialContext,
		TLSClientConfig:        c.tlsConf,
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  timeout,
		MaxIdleConnsPerHost:    2,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	c.hc = &http.Client{Transport: tr, Timeout: timeout, CheckRedirect: c.checkRedirect}
	return nil
}

// pinnedTLS verifies the peer only by its leaf's SPKI: chain and name
// checks are replaced, not skipped, by VerifyConnection, which runs on every
// handshake (resumed ones too) and refuses any other key.
//
// With legacy, TLS 1.2 also offers the RSA key-exchange suites old BMCs
// speak (AES only, never 3DES or RC4); TLS 1.3 is still preferred when the
// BMC has it.
func pinnedTLS(want [32]byte, legacy bool) *tls.Config {
	conf := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by the pin check below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: no certificate presented", ErrPinMismatch)
			}
			leaf := cs.PeerCertificates[0]
			got := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
			if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				return fmt.Errorf("%w: it presents %s", ErrPinMismatch, pki.PinOfCert(leaf))
			}
			return nil
		},
	}
	if legacy {
		for _, cs := range tls.CipherSuites() {
			conf.CipherSuites = append(conf.CipherSuites, cs.ID)
		}
		conf.CipherSuites = append(conf.CipherSuites, legacySuites...)
	}
	return conf
}

// legacySuites are the RSA key-exchange suites LegacyTLS adds.
var legacySuites = []uint16{
	tls.TLS_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_RSA_WITH_AES_128_CBC_SHA, tls.TLS_RSA_WITH_AES_256_CBC_SHA,
}

// tlsHint names the way out of a handshake that failed because the BMC
// offers only what the client does not accept.
func (c *Client) tlsHint(err error) string {
	if c.LegacyTLS || err == nil {
		return ""
	}
	s := err.Error()
	if strings.Contains(s, "handshake failure") || strings.Contains(s, "protocol version") ||
		strings.Contains(s, "no cipher suite") || strings.Contains(s, "insufficient security") {
		return " (the BMC offers no TLS this client accepts by default; an old BMC that speaks only TLS 1.2 with RSA key exchange must be enrolled with legacy TLS: bcgw bmc-credentials --legacy-tls, and \"legacy_tls\": true in the command's bmc)"
	}
	return ""
}

// Verify connects and completes a TLS handshake, checking the pin, without
// sending any request. Callers use it to refuse a BMC before fetching its
// credentials.
func (c *Client) Verify(ctx context.Context) error {
	if err := c.init(); err != nil {
		return err
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: c.tlsConf}
	conn, err := d.DialContext(ctx, "tcp", c.host)
	if err != nil {
		return fmt.Errorf("redfish: connect %s: %w%s", c.host, err, c.tlsHint(err))
	}
	return conn.Close()
}

func (c *Client) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 3 {
		return errors.New("redfish: more than 3 redirects")
	}
	if req.URL.Scheme != "https" || !sameHost(req.URL.Host, c.host) {
		return fmt.Errorf("redfish: refused a redirect to another host: %w", ErrOutsideRoot)
	}
	if !underRoot(path.Clean("/" + req.URL.Path)) {
		return fmt.Errorf("redfish: refused a redirect to %s: %w", printable(req.URL.Path), ErrOutsideRoot)
	}
	return nil
}

func sameHost(a, hostport string) bool {
	if _, _, err := net.SplitHostPort(a); err != nil {
		a = net.JoinHostPort(strings.Trim(a, "[]"), "443")
	}
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(h); ip != nil {
		h = ip.String()
	}
	return strings.EqualFold(net.JoinHostPort(h, p), hostport)
}

func underRoot(p string) bool {
	return p == Root || strings.HasPrefix(p, Root+"/")
}

// resolveLink checks a link the BMC handed us (or one we built) and returns
// the path and query to request on host. It refuses links that leave
// /redfish/v1 or name another host.
func resolveLink(host, link string) (p, query string, err error) {
	if link == "" {
		return "", "", errors.New("redfish: empty link")
	}
	if len(link) > 2048 {
		return "", "", errors.New("redfish: link longer than 2048 bytes")
	}
	for _, r := range link {
		if r < 0x21 || r == 0x7f || r == '\\' || r == utf8.RuneError {
			return "", "", fmt.Errorf("redfish: link %s has a character links do not have", printable(link))
		}
	}
	u, err := url.Parse(link)
	if err != nil {
		return "", "", fmt.Errorf("redfish: link %s does not parse", printable(link))
	}
	if u.Scheme != "" || u.Host != "" || u.Opaque != "" || u.User != nil {
		if u.Scheme != "https" || u.User != nil || u.Opaque != "" || !sameHost(u.Host, host) {
			return "", "", fmt.Errorf("redfish: link %s names another host: %w", printable(link), ErrOutsideRoot)
		}
	}
	if !strings.HasPrefix(u.Path, "/") {
		return "", "", fmt.Errorf("redfish: link %s: %w", printable(link), ErrOutsideRoot)
	}
	clean := path.Clean(u.Path)
	if !underRoot(clean) {
		return "", "", fmt.Errorf("redfish: link %s: %w", printable(link), ErrOutsideRoot)
	}
	if u.RawQuery != "" {
		if _, err := url.ParseQuery(u.RawQuery); err != nil {
			return "", "", fmt.Errorf("redfish: link %s has a malformed query", printable(link))
		}
	}
	if strings.HasSuffix(u.Path, "/") {
		clean += "/" // some BMCs serve only the slashed spelling
	}
	return clean, u.RawQuery, nil
}

// printable shortens and sanitizes a value from a BMC for an error message.
func printable(s string) string {
	return strconv.Quote(clean(s, 160))
}

// clean strips control characters and bounds s to n bytes (on a rune
// boundary) for output.
func clean(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return -1
		}
		return r
	}, s)
	if len(s) > n {
		i := n
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
		s = s[:i] + "…"
	}
	return s
}

// Error is a Redfish request the BMC answered with an error status.
type Error struct {
	Method     string
	Path       string
	StatusCode int
	// Message is the BMC's @Message.ExtendedInfo messages (or error.message),
	// sanitized, bounded and with secrets removed; empty when it sent none.
	Message string
}

func (e *Error) Error() string {
	s := fmt.Sprintf("redfish: %s %s: %d %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// StatusOf returns the HTTP status of a Redfish error in err's chain, or 0.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.StatusCode
	}
	return 0
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request to a path under /redfish/v1. body, when it carries
// secrets, is the caller's to zero.
func (c *Client) do(ctx context.Context, method, link string, body []byte, hdr http.Header, auth bool) (*response, error) {
	if err := c.init(); err != nil {
		return nil, err
	}
	p, q, err := resolveLink(c.host, link)
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+c.host+"/", rd)
	if err != nil {
		return nil, fmt.Errorf("redfish: %s %s: %w", method, p, err)
	}
	req.URL.Path, req.URL.RawQuery = p, q
	req.Header.Set("Accept", "application/json")
	req.Header.Set("OData-Version", "4.0")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if auth {
		switch {
		case c.token != "":
			req.Header.Set("X-Auth-Token", c.token)
		case c.basic:
			req.SetBasicAuth(string(c.Username), string(c.Password))
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, &wrapped{msg: fmt.Sprintf("redfish: %s %s: %s%s", method, p, c.redact(errorText(err)), c.tlsHint(err)), err: sentinel(err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("redfish: %s %s: read response: %w", method, p, err)
	}
	if len(b) > MaxBody {
		return nil, fmt.Errorf("redfish: %s %s: response larger than %d bytes", method, p, MaxBody)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg := redfishMessage(b)
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			// A refusal's message may repeat the credentials in any
			// spelling; only its MessageIds are kept.
			msg = messageIDs(b)
		}
		return nil, &Error{Method: method, Path: p, StatusCode: resp.StatusCode, Message: c.redact(msg)}
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// errorText is the innermost message of a transport error, without the URL
// the url.Error adds (we print the path ourselves).
func errorText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// sentinel keeps the errors callers test for (the pin mismatch, a refused
// link, the context's end) reachable with errors.Is.
func sentinel(err error) error {
	for _, target := range []error{ErrPinMismatch, ErrOutsideRoot, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, target) {
			return target
		}
	}
	return nil
}

// wrapped is an error whose text was redacted but whose sentinel stays
// reachable.
type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }

// redfishMessage extracts the messages of a Redfish error body.
func redfishMessage(b []byte) string {
	var body struct {
		Error struct {
			Message string        `json:"message"`
			Info    []messageInfo `json:"@Message.ExtendedInfo"`
		} `json:"error"`
		Info []messageInfo `json:"@Message.ExtendedInfo"`
	}
	if json.Unmarshal(b, &body) != nil {
		return ""
	}
	var msgs []string
	for _, m := range append(body.Error.Info, body.Info...) {
		if s := strings.TrimSpace(m.Message); s != "" {
			msgs = append(msgs, s)
		} else if m.MessageID != "" {
			msgs = append(msgs, m.MessageID)
		}
		if len(msgs) == 4 {
			break
		}
	}
	if len(msgs) == 0 && body.Error.Message != "" {
		msgs = append(msgs, body.Error.Message)
	}
	return clean(strings.Join(msgs, "; "), 512)
}

// messageIDs lists the MessageIds of a Redfish error body (registry
// names, never user data).
func messageIDs(b []byte) string {
	var body struct {
		Error struct {
			Code string        `json:"code"`
			Info []messageInfo `json:"@Message.ExtendedInfo"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &body) != nil {
		return ""
	}
	var ids []string
	for _, m := range body.Error.Info {
		if validMessageID(m.MessageID) && len(ids) < 4 {
			ids = append(ids, m.MessageID)
		}
	}
	if len(ids) == 0 && validMessageID(body.Error.Code) {
		ids = append(ids, body.Error.Code)
	}
	return strings.Join(ids, "; ")
}

// validMessageID accepts Registry.Major.Minor.Patch.Name style ids.
func validMessageID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, r := range id {
		if !(r == '.' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

type messageInfo struct {
	MessageID string `json:"MessageId"`
	Message   string `json:"Message"`
}

// redact removes the passwords and the session token from a message the
// BMC (or the transport) produced.
func (c *Client) redact(s string) string {
	secrets := append([][]byte{c.Password, []byte(c.token)}, c.redactAlt...)
	b := []byte(s)
	for _, sec := range secrets {
		if len(sec) == 0 {
			continue
		}
		for _, form := range [][]byte{sec, jsonEscaped(sec), backslashEscaped(sec)} {
			b = bytes.ReplaceAll(b, form, []byte("[redacted]"))
		}
	}
	return string(b)
}

// getJSON GETs a resource into v and returns its ETag (header, else
// @odata.etag).
func (c *Client) getJSON(ctx context.Context, link string, v any) (etag string, err error) {
	r, err := c.get(ctx, link)
	if err != nil {
		return "", err
	}
	if err := decode(r.body, v); err != nil {
		return "", fmt.Errorf("redfish: GET %s: %w", printable(link), err)
	}
	return etagOf(r), nil
}

func (c *Client) get(ctx context.Context, link string) (*response, error) {
	if err := c.login(ctx); err != nil {
		return nil, err
	}
	return c.do(ctx, http.MethodGet, link, nil, nil, true)
}

func etagOf(r *response) string {
	if e := r.header.Get("ETag"); e != "" {
		return e
	}
	var b struct {
		ETag string `json:"@odata.etag"`
	}
	_ = json.Unmarshal(r.body, &b)
	return b.ETag
}

func decode(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("the BMC sent %s where %s belongs in %s", te.Value, te.Type, te.Field)
		}
		return errors.New("the BMC sent a body that is not JSON")
	}
	return nil
}

// post sends a JSON body (action or session).
func (c *Client) post(ctx context.Context, link string, body any) (*response, error) {
	if err := c.login(ctx); err != nil {
		return nil, err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return c.do(ctx, http.MethodPost, link, b, nil, true)
}

// link is a Redfish navigation property.
type link struct {
	ID string `json:"@odata.id"`
}

type collection struct {
	Members  []link `json:"Members"`
	NextLink string `json:"Members@odata.nextLink"`
}

// members lists a collection's member paths (each checked), following
// next links up to maxPages and keeping at most maxMembers.
func (c *Client) members(ctx context.Context, coll string) ([]string, error) {
	var out []string
	next := coll
	for page := 0; next != "" && page < maxPages; page++ {
		var col collection
		if _, err := c.getJSON(ctx, next, &col); err != nil {
			return nil, err
		}
		for _, m := range col.Members {
			p, _, err := resolveLink(c.host, m.ID)
			if err != nil {
				return nil, fmt.Errorf("member of %s: %w", printable(coll), err)
			}
			if len(out) == maxMembers {
				return out, nil
			}
			out = append(out, p)
		}
		next = col.NextLink
	}
	return out, nil
}

// flexInt decodes a number a BMC may send as a number, a numeric string or
// null; anything else reads as 0.
type flexInt int64

func (n *flexInt) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= -1e18 && f <= 1e18 {
		*n = flexInt(f)
	} else {
		*n = 0
	}
	return nil
}

// flexFloat is flexInt for fractional values.
type flexFloat float64

func (n *flexFloat) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= -1e18 && f <= 1e18 {
		*n = flexFloat(f)
	} else {
		*n = 0
	}
	return nil
}

// flexBool decodes true/false or "true"/"false"; anything else reads false.
type flexBool bool

func (v *flexBool) UnmarshalJSON(b []byte) error {
	*v = flexBool(strings.EqualFold(strings.Trim(string(b), `"`), "true"))
	return nil
}

// jsonEscaped returns the JSON string escaping of b, without quotes.
func jsonEscaped(b []byte) []byte {
	out := make([]byte, 0, len(b)+8)
	return appendEscaped(out, b)
}

const hexDigits = "0123456789abcdef"

// backslashEscaped escapes only quotes and backslashes, as BMCs that quote
// a value in a message (and JSON encoders without HTML escaping) do.
func backslashEscaped(b []byte) []byte {
	out := make([]byte, 0, len(b)+8)
	for _, c := range b {
		if c == '"' || c == '\\' {
			out = append(out, '\\')
		}
		out = append(out, c)
	}
	return out
}

// appendEscaped appends the JSON escaping of b to out. It never allocates
// beyond out's capacity when the caller sized it with escapedLen.
func appendEscaped(out, b []byte) []byte {
	for _, c := range b {
		switch {
		case c == '"' || c == '\\':
			out = append(out, '\\', c)
		case c < 0x20 || c == '<' || c == '>' || c == '&' || c == 0x7f:
			out = append(out, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			out = append(out, c)
		}
	}
	return out
}

func escapedLen(b []byte) int {
	n := 0
	for _, c := range b {
		switch {
		case c == '"' || c == '\\':
			n += 2
		case c < 0x20 || c == '<' || c == '>' || c == '&' || c == 0x7f:
			n += 6
		default:
			n++
		}
	}
	return n
}

// secretBody builds {"k1":"v1",...} from byte values in one allocation the
// caller zeroes, so no string copy of a secret is made.
func secretBody(kv ...[]byte) []byte {
	n := 2 // braces
	for i := 0; i < len(kv); i += 2 {
		n += escapedLen(kv[i]) + escapedLen(kv[i+1]) + 5 // quotes and colon
		if i > 0 {
			n++ // comma
		}
	}
	out := make([]byte, 0, n)
	out = append(out, '{')
	for i := 0; i < len(kv); i += 2 {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = appendEscaped(out, kv[i])
		out = append(out, '"', ':', '"')
		out = appendEscaped(out, kv[i+1])
		out = append(out, '"')
	}
	return append(out, '}')
}
