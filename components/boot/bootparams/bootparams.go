// Package bootparams is the bc.* kernel command line between bcd site and
// bcd ramdisk: the site agent renders it into each PXE machine's iPXE
// script, and the ramdisk reads it back from /proc/cmdline.
//
// The parameters give the ramdisk everything it needs to join without a
// configuration file: the gateway, the three pins, the join encryption key,
// the machine's discovery token and the site's signed discovery assertion.
// Render refuses a value that would not survive the kernel's command line
// splitting (spaces, quotes, control characters) and Parse refuses a bc.*
// word that is missing, given twice or malformed, naming the parameter but
// never echoing its value (tokens travel here). docs/bootparams.md lists
// every parameter.
package bootparams

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Prefix starts every parameter this package reads or writes.
const Prefix = "bc."

// The parameter names, without the bc. prefix.
const (
	NameGateway           = "gateway"
	NameServerName        = "server_name"
	NameServingCAPin      = "ca_pin"
	NameJoinSigningPin    = "signing_pin"
	NameJoinEncryptionPin = "encryption_pin"
	NameJWK               = "jwk"
	NameDiscoveryToken    = "token"
	NameAssertion         = "assertion"
	NameSite              = "site"
	NameMAC               = "mac"
	NameCacheURL          = "cache"
)

// Size bounds. A kernel command line is at most 2048 bytes on x86-64 and
// arm64, and the iPXE script adds console and initrd arguments, so the bc.*
// part is held well below that.
const (
	MaxURLLen        = 256  // bc.gateway, bc.cache
	MaxServerNameLen = 253  // bc.server_name (a DNS name)
	MaxJWKLen        = 512  // bytes of JWK JSON before base64url
	MaxTokenLen      = 256  // bc.token
	MaxAssertionLen  = 1024 // bc.assertion, the compact JWS
	MaxSiteLen       = 64   // bc.site
	MaxRenderedLen   = 1536 // everything Render returns
	MaxCmdlineLen    = 8192 // the whole command line Parse reads
)

// Params are the bc.* kernel parameters.
type Params struct {
	// Gateway is the http(s) URL of the gateway the ramdisk dials
	// (bc.gateway; config.toml's gateway). Whether http:// is acceptable is
	// the ramdisk's decision (only fakehw builds take it).
	Gateway string
	// ServerName is the TLS server name of the gateway when it is reached
	// by IP address (bc.server_name, optional; gateway_server_name).
	ServerName string
	// ServingCAPin pins the gateway's serving CA: sha256/<base64>
	// (bc.ca_pin; serving_ca_spki_pin).
	ServingCAPin string
	// JoinSigningPin pins the key that signs JoinResponses
	// (bc.signing_pin; join_signing_key_pin).
	JoinSigningPin string
	// JoinEncryptionPin pins the key join tokens are sealed to
	// (bc.encryption_pin; join_encryption_key_pin).
	JoinEncryptionPin string
	// JWK is the JSON of the public join encryption key, the content of
	// join-encryption.jwk (bc.jwk carries it as unpadded base64url).
	// Whether it matches JoinEncryptionPin is checked by the ramdisk.
	JWK []byte
	// DiscoveryToken is the machine's one-time discovery token (bc.token).
	DiscoveryToken string
	// Assertion is the site agent's signed discovery assertion for this
	// machine, a compact JWS (bc.assertion). Parse checks its shape only;
	// the gateway verifies the signature.
	Assertion string
	// Site names the site (bc.site; config.toml's site).
	Site string
	// MAC is the machine's boot interface (bc.mac), six bytes.
	MAC net.HardwareAddr
	// CacheURL is the http(s) base URL of the site's image cache, which
	// the ramdisk tries before an image's source (bc.cache, optional).
	CacheURL string
}

// Render returns the parameters as space-separated bc.name=value words in
// a fixed order, ready to append to a kernel command line.
func Render(p Params) (string, error) {
	words := make([]string, 0, 11)
	add := func(name, value string) { words = append(words, Prefix+name+"="+value) }
	var errs []error
	check := func(name string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("rendering %s%s: %w", Prefix, name, err))
		}
	}

	check(NameGateway, checkURL(p.Gateway))
	add(NameGateway, p.Gateway)
	if p.ServerName != "" {
		check(NameServerName, checkServerName(p.ServerName))
		add(NameServerName, p.ServerName)
	}
	check(NameServingCAPin, checkPin(p.ServingCAPin))
	add(NameServingCAPin, p.ServingCAPin)
	check(NameJoinSigningPin, checkPin(p.JoinSigningPin))
	add(NameJoinSigningPin, p.JoinSigningPin)
	check(NameJoinEncryptionPin, checkPin(p.JoinEncryptionPin))
	add(NameJoinEncryptionPin, p.JoinEncryptionPin)
	check(NameJWK, checkJWK(p.JWK))
	add(NameJWK, base64.RawURLEncoding.EncodeToString(p.JWK))
	check(NameDiscoveryToken, checkToken(p.DiscoveryToken))
	add(NameDiscoveryToken, p.DiscoveryToken)
	check(NameAssertion, checkAssertion(p.Assertion))
	add(NameAssertion, p.Assertion)
	check(NameSite, checkSite(p.Site))
	add(NameSite, p.Site)
	if len(p.MAC) != 6 {
		check(NameMAC, errors.New("must be a 6-byte Ethernet address"))
	}
	add(NameMAC, p.MAC.String())
	if p.CacheURL != "" {
		check(NameCacheURL, checkURL(p.CacheURL))
		add(NameCacheURL, p.CacheURL)
	}
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	s := strings.Join(words, " ")
	if len(s) > MaxRenderedLen {
		return "", fmt.Errorf("rendering boot parameters: %d bytes, more than %d", len(s), MaxRenderedLen)
	}
	return s, nil
}

// Parse reads the bc.* parameters from a kernel command line such as the
// content of /proc/cmdline. Words that do not start with bc. are ignored,
// and so are bc.* names this version does not know (a newer site agent may
// add some). Double quotes group words as the kernel groups them; a bc.*
// word may not contain one.
func Parse(cmdline string) (Params, error) {
	if len(cmdline) > MaxCmdlineLen {
		return Params{}, fmt.Errorf("parsing boot parameters: command line is %d bytes, more than %d", len(cmdline), MaxCmdlineLen)
	}
	values := map[string]string{}
	for _, word := range splitCmdline(cmdline) {
		unquoted := strings.ReplaceAll(word, `"`, "")
		if !strings.HasPrefix(unquoted, Prefix) {
			continue
		}
		key, value, hasValue := strings.Cut(unquoted, "=")
		name := strings.TrimPrefix(key, Prefix)
		if !validName(name) {
			return Params{}, fmt.Errorf("parsing boot parameters: a bc.* word has a malformed name")
		}
		if !known(name) {
			continue
		}
		switch {
		case strings.Contains(word, `"`):
			return Params{}, fmt.Errorf("parsing %s: must not be quoted", key)
		case !hasValue:
			return Params{}, fmt.Errorf("parsing %s: has no value (want %s=...)", key, key)
		}
		if _, dup := values[name]; dup {
			return Params{}, fmt.Errorf("parsing %s: given more than once", key)
		}
		values[name] = value
	}

	var p Params
	var errs []error
	get := func(name string, required bool, check func(string) error) string {
		v, ok := values[name]
		if !ok {
			if required {
				errs = append(errs, fmt.Errorf("parsing %s%s: missing", Prefix, name))
			}
			return ""
		}
		if err := check(v); err != nil {
			errs = append(errs, fmt.Errorf("parsing %s%s: %w", Prefix, name, err))
			return ""
		}
		return v
	}
	p.Gateway = get(NameGateway, true, checkURL)
	p.ServerName = get(NameServerName, false, checkServerName)
	p.ServingCAPin = get(NameServingCAPin, true, checkPin)
	p.JoinSigningPin = get(NameJoinSigningPin, true, checkPin)
	p.JoinEncryptionPin = get(NameJoinEncryptionPin, true, checkPin)
	if enc := get(NameJWK, true, checkJWKText); enc != "" {
		p.JWK, _ = base64.RawURLEncoding.Strict().DecodeString(enc) // checked by checkJWKText
	}
	p.DiscoveryToken = get(NameDiscoveryToken, true, checkToken)
	p.Assertion = get(NameAssertion, true, checkAssertion)
	p.Site = get(NameSite, true, checkSite)
	if m := get(NameMAC, true, checkMACText); m != "" {
		p.MAC, _ = net.ParseMAC(m) // checked by checkMACText
	}
	p.CacheURL = get(NameCacheURL, false, checkURL)
	if len(errs) > 0 {
		return Params{}, errors.Join(errs...)
	}
	return p, nil
}

// splitCmdline splits a command line into words the way the kernel's
// next_arg does: at spaces and tabs outside double quotes. Quotes stay in
// the words.
func splitCmdline(s string) []string {
	var words []string
	start, inQuote := -1, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '"' {
			inQuote = !inQuote
		}
		if isCmdlineSpace(c) && !inQuote {
			if start >= 0 {
				words = append(words, s[start:i])
				start = -1
			}
			continue
		}
		if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		words = append(words, s[start:])
	}
	return words
}

func isCmdlineSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// known reports whether name is a parameter this version reads.
func known(name string) bool {
	switch name {
	case NameGateway, NameServerName, NameServingCAPin, NameJoinSigningPin, NameJoinEncryptionPin,
		NameJWK, NameDiscoveryToken, NameAssertion, NameSite, NameMAC, NameCacheURL:
		return true
	}
	return false
}

// validName accepts lower-case letters, digits and _ (at most 32), so an
// error can name the parameter without echoing arbitrary bytes.
func validName(name string) bool {
	if name == "" || len(name) > 32 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// checkURL accepts an absolute http or https URL with a host and no user
// information or fragment, without spaces, quotes or control characters.
func checkURL(s string) error {
	if s == "" {
		return errors.New("empty; want an http(s):// URL")
	}
	if len(s) > MaxURLLen {
		return fmt.Errorf("longer than %d bytes", MaxURLLen)
	}
	if err := checkPlain(s); err != nil {
		return err
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("is not a URL")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return errors.New("must be an https:// (or http://) URL")
	}
	if u.Host == "" || u.Hostname() == "" {
		return errors.New("needs a host")
	}
	if u.User != nil {
		return errors.New("must not contain a user name or password")
	}
	if u.Fragment != "" || strings.Contains(s, "#") {
		return errors.New("must not have a fragment")
	}
	return nil
}

// checkPlain refuses what the kernel or an iPXE script would split or
// mangle: spaces, quotes, backslashes, control and non-ASCII bytes, and
// iPXE's ${...} expansion.
func checkPlain(s string) error {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c <= ' ' || c >= 0x7f:
			return errors.New("must not contain spaces, control characters or non-ASCII bytes")
		case c == '"' || c == '\'' || c == '`' || c == '\\':
			return errors.New("must not contain quotes or backslashes")
		case c == '$':
			return errors.New("must not contain $")
		}
	}
	return nil
}

// checkServerName accepts a DNS name such as gw.example.com.
func checkServerName(s string) error {
	if s == "" || len(s) > MaxServerNameLen {
		return errors.New("must be a DNS name of 1 to 253 bytes")
	}
	for label := range strings.SplitSeq(strings.TrimSuffix(s, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("must be a DNS name such as gw.example.com")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return errors.New("must be a DNS name such as gw.example.com")
			}
		}
	}
	return nil
}

// checkPin accepts sha256/ followed by the standard padded base64 of 32
// bytes, the format of config.toml's pins.
func checkPin(s string) error {
	b64, ok := strings.CutPrefix(s, "sha256/")
	if !ok {
		return errors.New("must be sha256/ followed by the base64 SHA-256 of the key")
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil || len(raw) != 32 {
		return errors.New("the part after sha256/ must be the padded standard base64 of 32 bytes")
	}
	return nil
}

// checkJWK accepts a JSON object of at most MaxJWKLen bytes with a "kty".
func checkJWK(b []byte) error {
	if len(b) == 0 {
		return errors.New("empty; want the JSON of the join encryption JWK")
	}
	if len(b) > MaxJWKLen {
		return fmt.Errorf("JWK JSON longer than %d bytes", MaxJWKLen)
	}
	var k map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&k); err != nil || dec.More() || k == nil {
		return errors.New("is not a JSON object")
	}
	var kty string
	if err := json.Unmarshal(k["kty"], &kty); err != nil || kty == "" {
		return errors.New(`has no "kty"`)
	}
	return nil
}

// checkJWKText accepts the unpadded base64url of a JWK checkJWK accepts.
func checkJWKText(s string) error {
	if len(s) > base64.RawURLEncoding.EncodedLen(MaxJWKLen) {
		return fmt.Errorf("JWK JSON longer than %d bytes", MaxJWKLen)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return errors.New("is not unpadded base64url")
	}
	return checkJWK(b)
}

// isTokenByte accepts the bytes of base64, base64url and common token
// alphabets.
func isTokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c == '~' || c == '+' || c == '/' || c == '='
}

// checkToken accepts 1 to MaxTokenLen token bytes.
func checkToken(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > MaxTokenLen {
		return fmt.Errorf("longer than %d bytes", MaxTokenLen)
	}
	for i := 0; i < len(s); i++ {
		if !isTokenByte(s[i]) {
			return errors.New("may hold only letters, digits and -_.~+/=")
		}
	}
	return nil
}

// checkAssertion accepts a compact JWS: three unpadded base64url parts, a
// header that is a JSON object and a non-empty payload and signature.
func checkAssertion(s string) error {
	if s == "" {
		return errors.New("empty; want a compact JWS")
	}
	if len(s) > MaxAssertionLen {
		return fmt.Errorf("longer than %d bytes", MaxAssertionLen)
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return errors.New("is not a compact JWS (header.payload.signature)")
	}
	for _, part := range parts {
		if part == "" {
			return errors.New("is not a compact JWS: a part is empty")
		}
		if _, err := base64.RawURLEncoding.Strict().DecodeString(part); err != nil {
			return errors.New("is not a compact JWS: a part is not unpadded base64url")
		}
	}
	header, _ := base64.RawURLEncoding.Strict().DecodeString(parts[0])
	var h map[string]json.RawMessage
	if err := json.Unmarshal(header, &h); err != nil || h == nil {
		return errors.New("is not a compact JWS: its header is not a JSON object")
	}
	return nil
}

// checkSite accepts letters, digits, '-', '_' and '.', 1 to MaxSiteLen.
func checkSite(s string) error {
	if s == "" || len(s) > MaxSiteLen {
		return fmt.Errorf("must be 1 to %d bytes", MaxSiteLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return errors.New("may hold only letters, digits, '-', '_' and '.'")
		}
	}
	return nil
}

// checkMACText accepts six bytes written as lower-case hex pairs separated
// by colons, the form Render writes.
func checkMACText(s string) error {
	m, err := net.ParseMAC(s)
	if err != nil || len(m) != 6 || m.String() != s {
		return errors.New("must be a 6-byte MAC written like 52:54:00:12:34:56")
	}
	return nil
}
