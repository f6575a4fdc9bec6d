package bmckinds

import (
	"context"
	"encoding/json"
	"errors"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/better-compute/bcd/components/agent/session"
)

// credentials are a BMC's user name and password, in buffers the kind
// zeroes when the command ends.
type credentials struct {
	username, password []byte
}

// secret asks the gateway for a secret bound to the running command.
func secret(ctx context.Context, name string) ([]byte, error) {
	return session.CommandSecret(ctx, name)
}

// fetchCredentials fetches and parses the bmc-credentials secret; the raw
// answer is zeroed before it returns.
func fetchCredentials(ctx context.Context) (credentials, error) {
	raw, err := secret(ctx, CredentialsSecret)
	if err != nil {
		return credentials{}, err
	}
	defer clear(raw)
	return parseCredentials(raw)
}

// parseCredentials parses {"username": "...", "password": "..."} into byte
// slices without making strings of them: encoding/json copies each value
// into a RawMessage (zeroed here), and unquote decodes it in place of a
// string. Errors never quote the input.
func parseCredentials(raw []byte) (credentials, error) {
	bad := errors.New(CredentialsSecret + `: not a JSON object with exactly "username" and "password" strings`)
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return credentials{}, bad
	}
	defer func() {
		for _, v := range m {
			clear(v)
		}
	}()
	u, okU := m["username"]
	p, okP := m["password"]
	if len(m) != 2 || !okU || !okP {
		return credentials{}, bad
	}
	user, ok1 := unquote(u)
	pass, ok2 := unquote(p)
	if !ok1 || !ok2 || len(user) == 0 || len(pass) == 0 {
		clear(user)
		clear(pass)
		return credentials{}, bad
	}
	return credentials{username: user, password: pass}, nil
}

// fetchNewPassword fetches bmc-new-password: the password's bytes, UTF-8,
// 1 to 256 bytes, no control characters.
func fetchNewPassword(ctx context.Context) ([]byte, error) {
	pw, err := secret(ctx, NewPasswordSecret)
	if err != nil {
		return nil, err
	}
	if len(pw) == 0 || len(pw) > 256 || !utf8.Valid(pw) {
		clear(pw)
		return nil, errors.New(NewPasswordSecret + ": must be 1 to 256 bytes of UTF-8")
	}
	for _, c := range pw {
		if c < 0x20 || c == 0x7f {
			clear(pw)
			return nil, errors.New(NewPasswordSecret + ": must not contain control characters")
		}
	}
	return pw, nil
}

// unquote decodes a JSON string literal into a new slice, never longer than
// the literal, so it is allocated once and holds the only copy.
func unquote(b []byte) ([]byte, bool) {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return nil, false
	}
	b = b[1 : len(b)-1]
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '\\':
			if i+1 >= len(b) {
				return nil, false
			}
			switch e := b[i+1]; e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := hex4(b[i+2:])
				if !ok {
					return nil, false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					r2, ok := rune(0), false
					if i+1 < len(b) && b[i] == '\\' && b[i+1] == 'u' {
						r2, ok = hex4(b[i+2:])
					}
					if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
						r = dec
						i += 6
					} else {
						r = utf8.RuneError
					}
				}
				out = utf8.AppendRune(out, r)
				continue
			default:
				return nil, false
			}
			i += 2
		case c < 0x20:
			return nil, false
		default:
			out = append(out, c)
			i++
		}
	}
	return out, true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// jsonEscape is how encoding/json writes b inside a string (without the
// quotes), used to find a secret in a marshalled result. It works on the
// bytes, so no string copy of the secret is made. Without html, <, > and &
// are left as they are (as other JSON encoders write them).
func jsonEscape(b []byte, html bool) []byte {
	const hexd = "0123456789abcdef"
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				out = append(out, '\\', c)
			case c == '\n':
				out = append(out, '\\', 'n')
			case c == '\r':
				out = append(out, '\\', 'r')
			case c == '\t':
				out = append(out, '\\', 't')
			case c == '\b':
				out = append(out, '\\', 'b')
			case c == '\f':
				out = append(out, '\\', 'f')
			case c < 0x20 || html && (c == '<' || c == '>' || c == '&'):
				out = append(out, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
			default:
				out = append(out, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, `\ufffd`...)
		case html && (r == '\u2028' || r == '\u2029'):
			out = append(out, '\\', 'u', '2', '0', '2', hexd[r&0xf])
		default:
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return out
}
