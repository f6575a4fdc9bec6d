package logbundle

import (
	"bytes"
	"regexp"
	"strings"
)

// Redacted replaces every secret Redact removes; a URL's password becomes
// RedactedURLPassword instead, so the URL stays one word.
const (
	Redacted            = "[REDACTED]"
	RedactedURLPassword = "REDACTED"
)

// Redact returns b with the secrets a log bundle must not carry replaced by
// Redacted: PEM private key blocks (from the BEGIN line through the END
// line; an unterminated block through its last base64 line), bcd join
// tokens (bcjt_...), JWTs and compact JWEs, the password of a URL
// (scheme://user:REDACTED@host), Authorization header values, and the
// value of every assignment whose key names a token, secret, password or
// private key (key = "...", KEY=..., "key": "...", and key: ... at the start
// of a line). It runs in time linear in len(b) and never modifies b.
func Redact(b []byte) []byte {
	return newRedactor().redact(b)
}

// redactor holds the compiled patterns of Redact. Go's regexp engine runs
// in linear time, so no input can make a pattern backtrack.
type redactor struct {
	joinToken *regexp.Regexp
	jwt       *regexp.Regexp
	urlPass   *regexp.Regexp
	authz     *regexp.Regexp
	bearer    *regexp.Regexp
}

func newRedactor() *redactor {
	const b64url = `[A-Za-z0-9_-]`
	return &redactor{
		joinToken: regexp.MustCompile(`bcjt_[A-Za-z0-9_-]+`),
		// A compact JWE (five segments) first, so it is not cut after its
		// third segment; then a JWS whose header and payload are JSON.
		jwt: regexp.MustCompile(`eyJ` + b64url + `*\.` + b64url + `*\.` + b64url + `+\.` + b64url + `+\.` + b64url + `+` +
			`|eyJ` + b64url + `*\.eyJ` + b64url + `*\.` + b64url + `*`),
		// The password runs to the last @ before the host, in case it
		// holds an unescaped one.
		urlPass: regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@\[\]]*):[^\s/?#]+@`),
		authz:   regexp.MustCompile(`(?i)(\bauthorization["']?[ \t]{0,8}[:=][ \t]{0,8}["']?)((?:bearer|basic|token|digest|negotiate)[ \t]+)?[^\s"',;]+`),
		bearer:  regexp.MustCompile(`(?i)\b(bearer[ \t]+)[A-Za-z0-9._~+/-]{16,}=*`),
	}
}

func (r *redactor) redact(b []byte) []byte {
	out := redactPEM(b)
	// Each pattern runs only when its literal part is there.
	if bytes.Contains(out, []byte("bcjt_")) {
		out = r.joinToken.ReplaceAllLiteral(out, []byte(Redacted))
	}
	if bytes.Contains(out, []byte("eyJ")) {
		out = r.jwt.ReplaceAllLiteral(out, []byte(Redacted))
	}
	if bytes.Contains(out, []byte("://")) {
		out = r.urlPass.ReplaceAll(out, []byte("${1}:"+RedactedURLPassword+"@"))
	}
	lower := bytes.ToLower(out)
	if bytes.Contains(lower, []byte("authorization")) {
		out = r.authz.ReplaceAll(out, []byte("${1}${2}"+Redacted))
	}
	if bytes.Contains(lower, []byte("bearer")) {
		out = r.bearer.ReplaceAll(out, []byte("${1}"+Redacted))
	}
	return redactAssignments(out)
}

// PEM private keys.

const (
	pemBegin   = "-----BEGIN "
	pemEnd     = "-----END "
	pemKey     = "PRIVATE KEY"
	pemDashes  = "-----"
	maxLabel   = 64       // label characters before "PRIVATE KEY"
	maxPEMSpan = 64 << 10 // the END line must come this soon after BEGIN
)

// pemMarker reports whether b starts with a private key BEGIN or END line
// (prefix is pemBegin or pemEnd): prefix, up to maxLabel characters of
// [A-Z0-9 ], "PRIVATE KEY", then five dashes. It returns the marker's
// length.
func pemMarker(b []byte, prefix string) (int, bool) {
	if !bytes.HasPrefix(b, []byte(prefix)) {
		return 0, false
	}
	i := len(prefix)
	limit := min(len(b), i+maxLabel+len(pemKey)+1)
	j := i
	for j < limit && isLabel(b[j]) {
		j++
	}
	if j-i > maxLabel+len(pemKey) || !bytes.HasSuffix(b[i:j], []byte(pemKey)) || !bytes.HasPrefix(b[j:], []byte(pemDashes)) {
		return 0, false
	}
	return j + len(pemDashes), true
}

func isLabel(c byte) bool {
	return c == ' ' || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// redactPEM replaces each private key block, from its BEGIN line through
// the END line that follows within maxPEMSpan. A block with no END line
// is replaced through the rest of its BEGIN line and the base64 and
// header lines after it. Every BEGIN line is found, even one that starts
// inside the previous block's last dashes.
func redactPEM(b []byte) []byte {
	if !bytes.Contains(b, []byte(pemBegin)) {
		return b
	}
	// The END lines, in order; ends[e] is the next candidate.
	var ends [][2]int
	for i := 0; ; {
		k := bytes.Index(b[i:], []byte(pemEnd))
		if k < 0 {
			break
		}
		if n, ok := pemMarker(b[i+k:], pemEnd); ok {
			ends = append(ends, [2]int{i + k, i + k + n})
		}
		i += k + 1
	}
	var spans [][2]int
	e := 0
	for i := 0; ; {
		k := bytes.Index(b[i:], []byte(pemBegin))
		if k < 0 {
			break
		}
		start := i + k
		n, ok := pemMarker(b[start:], pemBegin)
		if !ok {
			i = start + 1
			continue
		}
		hdrEnd := start + n
		for e < len(ends) && ends[e][0] < hdrEnd {
			e++
		}
		end := 0
		if e < len(ends) && ends[e][0]-hdrEnd <= maxPEMSpan {
			end = ends[e][1]
		} else {
			end = pemBodyEnd(b, hdrEnd)
		}
		if len(spans) > 0 && start <= spans[len(spans)-1][1] {
			spans[len(spans)-1][1] = max(spans[len(spans)-1][1], end)
		} else {
			spans = append(spans, [2]int{start, end})
		}
		// A BEGIN line may start in the block's closing dashes.
		i = max(start+1, end-len(pemDashes)+1)
	}
	if len(spans) == 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	last := 0
	for _, s := range spans {
		out = append(out, b[last:s[0]]...)
		out = append(out, Redacted...)
		last = s[1]
	}
	return append(out, b[last:]...)
}

// pemBodyEnd returns where the body of an unterminated key that starts at
// i ends: after the rest of its line, the lines of base64 and the
// Proc-Type and DEK-Info headers (with the blank line after them) that
// follow.
func pemBodyEnd(b []byte, i int) int {
	i = lineEnd(b, i)
	afterHeader := false
	for i < len(b) {
		j := lineEnd(b, i)
		line := bytes.TrimRight(b[i:j], "\r\n")
		switch {
		case len(line) == 0 && afterHeader:
			afterHeader = false
		case len(line) > 0 && (bytes.HasPrefix(line, []byte("Proc-Type:")) || bytes.HasPrefix(line, []byte("DEK-Info:"))):
			afterHeader = true
		case len(line) > 0 && isBase64(line):
			afterHeader = false
		default:
			return i
		}
		i = j
	}
	return i
}

// lineEnd returns the index after the newline that ends the line holding
// b[i], or len(b).
func lineEnd(b []byte, i int) int {
	if k := bytes.IndexByte(b[i:], '\n'); k >= 0 {
		return i + k + 1
	}
	return len(b)
}

func isBase64(b []byte) bool {
	for _, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=') {
			return false
		}
	}
	return true
}

// Assignments.

const (
	maxKey   = 128 // longest key looked at
	maxSpace = 16  // blanks looked through around a separator
)

// redactAssignments replaces the value of each key=value, "key": value
// and key: value (the key first on its line) whose key is sensitive. It
// looks back from each separator over at most maxKey+maxSpace bytes and
// skips past each value it replaces, so it runs in linear time.
func redactAssignments(b []byte) []byte {
	var out []byte
	last := 0
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '=' && c != ':' {
			continue
		}
		key, start, quoted, ok := keyBefore(b, i)
		if !ok || !sensitiveKey(key) {
			continue
		}
		if c == ':' && (bytes.HasPrefix(b[i+1:], []byte("//")) || !quoted && !firstOnLine(b, start)) {
			continue
		}
		// Look at the value's start before scanning it: a value already
		// redacted is not scanned, so no byte is scanned twice.
		vs, q := valueStart(b, i+1)
		if vs >= len(b) || bytes.HasPrefix(b[vs:], []byte(Redacted)) {
			continue
		}
		ve := valueEnd(b, vs, q)
		if ve <= vs {
			continue
		}
		if out == nil {
			out = make([]byte, 0, len(b))
		}
		out = append(out, b[last:vs]...)
		out = append(out, Redacted...)
		last = ve
		i = ve - 1
	}
	if out == nil {
		return b
	}
	return append(out, b[last:]...)
}

func isKeyChar(c byte) bool {
	return c == '_' || c == '-' || c == '.' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// keyBefore returns the key before the separator at sep: key chars, maybe
// in quotes, maybe followed by blanks. start is where the key (or its
// opening quote) begins.
func keyBefore(b []byte, sep int) (key []byte, start int, quoted, ok bool) {
	j := sep
	for n := 0; j > 0 && (b[j-1] == ' ' || b[j-1] == '\t'); n++ {
		if n == maxSpace {
			return nil, 0, false, false
		}
		j--
	}
	var q byte
	if j > 0 && (b[j-1] == '"' || b[j-1] == '\'') {
		q = b[j-1]
		j--
	}
	k := j
	for k > 0 && isKeyChar(b[k-1]) {
		if j-k == maxKey {
			return nil, 0, false, false
		}
		k--
	}
	if k == j {
		return nil, 0, false, false
	}
	if q != 0 {
		if k == 0 || b[k-1] != q {
			return nil, 0, false, false
		}
		return b[k:j], k - 1, true, true
	}
	return b[k:j], k, false, true
}

// firstOnLine reports whether only blanks and list dashes come before
// b[i] on its line (a YAML key).
func firstOnLine(b []byte, i int) bool {
	for n := 0; i > 0 && n < maxSpace; n++ {
		switch b[i-1] {
		case '\n':
			return true
		case ' ', '\t', '-':
			i--
		default:
			return false
		}
	}
	return i == 0
}

// valueStart skips the blanks after a separator and an opening quote,
// and returns where the value starts and its quote (0 when unquoted).
func valueStart(b []byte, i int) (int, byte) {
	for n := 0; i < len(b) && (b[i] == ' ' || b[i] == '\t') && n < maxSpace; n++ {
		i++
	}
	if i < len(b) && (b[i] == '"' || b[i] == '\'') {
		return i + 1, b[i]
	}
	return i, 0
}

// valueEnd returns where a value that starts at i ends: at its closing
// quote (the end of the line when unclosed), or, unquoted, at a blank or
// a delimiter.
func valueEnd(b []byte, i int, q byte) int {
	j := i
	if q != 0 {
		for j < len(b) && b[j] != q && b[j] != '\n' {
			if b[j] == '\\' && q == '"' && j+1 < len(b) && b[j+1] != '\n' {
				j++
			}
			j++
		}
		if j < len(b) && b[j] == q {
			return j
		}
		return trimEOL(b, i, j)
	}
	for j < len(b) && !endsValue(b[j]) {
		j++
	}
	return j
}

func endsValue(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', '"', '\'', ',', ';', '&', ')', ']', '}', '>':
		return true
	}
	return false
}

// trimEOL keeps a carriage return that ends the line out of a value.
func trimEOL(b []byte, i, j int) int {
	if j > i && b[j-1] == '\r' {
		return j - 1
	}
	return j
}

// sensitiveKey reports whether a key names a secret: one of its words (split
// at _ . -) is or ends in token, secret, password, passwd or passphrase
// (with plurals), or it names a private key or an API key. A key whose last
// word says it holds a location or a property of the secret (token_file,
// secret_path, token_ttl) is not.
func sensitiveKey(key []byte) bool {
	k := strings.ToLower(string(key))
	words := strings.FieldsFunc(k, func(r rune) bool { return r == '_' || r == '.' || r == '-' })
	if len(words) == 0 {
		return false
	}
	switch words[len(words)-1] {
	case "file", "path", "dir", "ttl", "type", "expiry", "expires", "url", "endpoint", "count", "len", "length", "size":
		if len(words) > 1 {
			return false
		}
	}
	for i, w := range words {
		for _, s := range []string{"token", "secret", "password", "passwd", "passphrase"} {
			if strings.HasSuffix(w, s) || strings.HasSuffix(w, s+"s") {
				return true
			}
		}
		if w == "privatekey" || w == "apikey" || w == "pwd" {
			return true
		}
		if (w == "private" || w == "api") && i+1 < len(words) && words[i+1] == "key" {
			return true
		}
	}
	return false
}
