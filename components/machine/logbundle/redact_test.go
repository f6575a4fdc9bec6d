package logbundle

import (
	"bytes"
	"encoding/base64"
	"regexp"
	"strings"
	"testing"
	"time"
)

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func TestRedact(t *testing.T) {
	jwt := b64(`{"alg":"ES256","typ":"JWT"}`) + "." + b64(`{"sub":"spiffe://site/node/n1","exp":1900000000}`) + "." + b64("not-really-a-signature-but-64-bytes-long-enough-for-the-test!!")
	jwe := b64(`{"alg":"ECDH-ES","enc":"A256GCM"}`) + ".." + b64("iv-iv-iv-iv") + "." + b64("ciphertext holding the join token") + "." + b64("tag-tag-tag-tag")
	const ecKey = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIFakeFakeFakeFakeFakeFakeFakeFakeFakeoAoGCCqGSM49\nAwEHoUQDQgAEFakeFakeFake==\n-----END EC PRIVATE KEY-----"
	tests := []struct {
		name, in, want string
	}{
		// Secrets.
		{"join token", "joining with bcjt_jt_01ab_S3cr3t-part_x9 now", "joining with [REDACTED] now"},
		{"join token env", "BCD_JOIN_TOKEN=bcjt_jt_01_abc\n", "BCD_JOIN_TOKEN=[REDACTED]\n"},
		{"jwt", "token " + jwt + " expired", "token [REDACTED] expired"},
		{"jwt unsigned", "got " + b64(`{"alg":"none"}`) + "." + b64(`{"a":1}`) + ". then", "got [REDACTED] then"},
		{"jwe", "sealed=" + jwe + ";", "sealed=[REDACTED];"},
		{"pkcs8", "key:\n-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgFake\n-----END PRIVATE KEY-----\nafter\n", "key:\n[REDACTED]\nafter\n"},
		{"ec", "a\n" + ecKey + "\nb", "a\n[REDACTED]\nb"},
		{"encrypted pkcs8", "-----BEGIN ENCRYPTED PRIVATE KEY-----\r\nMIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkqhkiG9w0BBQwwHAQIFake\r\n-----END ENCRYPTED PRIVATE KEY-----\r\n", "[REDACTED]\r\n"},
		{"openssh", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----", "[REDACTED]"},
		{"legacy rsa with headers", "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,0123456789ABCDEF\n\nMIIEpAIBAAKCAQEAFake\n-----END RSA PRIVATE KEY-----\nx", "[REDACTED]\nx"},
		{"unterminated key", "log: -----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\nAwEHBG0wawIBAQQgFake==\nnext log line\n", "log: [REDACTED]next log line\n"},
		{"unterminated legacy key", "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00FF\n\nMIIEpAIBAAKCAQEAFake\n\nnext", "[REDACTED]\nnext"},
		{"key in a JSON string", `{"key":"-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIFake\n-----END EC PRIVATE KEY-----\n","n":1}`, `{"key":"[REDACTED]\n","n":1}`},
		{"two keys back to back", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY----------BEGIN PRIVATE KEY-----\nBBBB\n-----END PRIVATE KEY-----", "[REDACTED]"},
		{"url password", "dsn postgres://bcd:hunter2@db.internal:5432/bcd?sslmode=verify-full", "dsn postgres://bcd:REDACTED@db.internal:5432/bcd?sslmode=verify-full"},
		{"url password with @", "proxy http://u:p@ss@proxy:3128/", "proxy http://u:REDACTED@proxy:3128/"},
		{"url empty user", "redis://:s3cret@cache:6379", "redis://:REDACTED@cache:6379"},
		{"authorization header", "Authorization: Bearer abc.def-ghi\nHost: x", "Authorization: Bearer [REDACTED]\nHost: x"},
		{"authorization json", `{"authorization":"Basic dXNlcjpwYXNz","path":"/"}`, `{"authorization":"Basic [REDACTED]","path":"/"}`},
		{"authorization bare value", "authorization=abcdef0123456789", "authorization=[REDACTED]"},
		{"bearer in a command line", "curl -H 'X-Auth: Bearer 0123456789abcdefXYZ' https://h/", "curl -H 'X-Auth: Bearer [REDACTED]' https://h/"},
		{"toml", "[gateway]\njoin_token = \"jt-value\"\nurl = \"https://gw\"\n", "[gateway]\njoin_token = \"[REDACTED]\"\nurl = \"https://gw\"\n"},
		{"toml single quotes", "client_secret='abc def'\n", "client_secret='[REDACTED]'\n"},
		{"env", "DB_PASSWORD=hunter2\nPATH=/usr/bin\n", "DB_PASSWORD=[REDACTED]\nPATH=/usr/bin\n"},
		{"ini", "[db]\npassword : hunter2\nuser=bcd", "[db]\npassword : [REDACTED]\nuser=bcd"},
		{"json", `{"node":"n1","password": "p\"w","private_key":"k"}`, `{"node":"n1","password": "[REDACTED]","private_key":"[REDACTED]"}`},
		{"yaml", "auth:\n  - apiToken: abc123\n  user: bcd\n", "auth:\n  - apiToken: [REDACTED]\n  user: bcd\n"},
		{"slog text", `level=WARN msg="retry with token=abc123" password=hunter2 n=1`, `level=WARN msg="retry with token=[REDACTED]" password=[REDACTED] n=1`},
		{"flag", "bcd join --token=abc123 --role node", "bcd join --token=[REDACTED] --role node"},
		{"private key value", "privateKey = MHcCAQEEI\napi_key: zzz", "privateKey = [REDACTED]\napi_key: [REDACTED]"},
		{"unclosed quote", "secret = \"abc def\r\nnext=1", "secret = \"[REDACTED]\r\nnext=1"},
		{"query parameter", "GET /cb?code=1&access_token=abc&x=2", "GET /cb?code=1&access_token=[REDACTED]&x=2"},
		// What must stay.
		{"normal url", "fetched https://example.com:8443/a/b?x=1&y=2#top ok", ""},
		{"ipv6 url", "listening on http://[::1]:8080/metrics", ""},
		{"email", "contact ops@example.com: paged", ""},
		{"tokenizer", "loading tokenizer from /models/llama\ntokenizer = bert-base\n", ""},
		{"token path", "token_file = /etc/bcd/token\nsecret_path: /run/secret\n", ""},
		{"base64 not a jwt", "payload " + b64(`{"alg":"none"}`) + " and dGhpcyBpcyBub3QgYSBqd3Q= and v1.2.3", ""},
		{"certificate", "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n", ""},
		{"public key", "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----\n", ""},
		{"lowercase begin", "-----BEGIN private KEY-----", ""},
		{"authorization prose", "authorization failed for node n1", ""},
		{"bearer prose", "the bearer of bad news", ""},
		{"password prose", "password rotated at 12:00", ""},
		{"yaml key mid-line", "note token: refresh later", ""},
		{"already redacted", "token=[REDACTED] password: [REDACTED]", ""},
		{"empty values", "token=\npassword=\"\"\n", ""},
		{"bcjt prefix alone", "tokens look like bcjt_", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want == "" {
				want = tt.in
			}
			in := []byte(tt.in)
			got := Redact(in)
			if string(got) != want {
				t.Errorf("Redact(%q)\n got %q\nwant %q", tt.in, got, want)
			}
			if string(in) != tt.in {
				t.Errorf("Redact modified its input to %q", in)
			}
		})
	}
}

func TestSensitiveKey(t *testing.T) {
	for key, want := range map[string]bool{
		"token": true, "join_token": true, "BCD_JOIN_TOKEN": true, "apiToken": true, "tokens": true,
		"secret": true, "client-secret": true, "clientSecret": true, "aws.secret_access_key": true,
		"password": true, "DB_PASSWD": true, "passphrase": true, "pwd": true,
		"private_key": true, "privateKey": true, "api_key": true, "apikey": true,
		"tokenizer": false, "token_file": false, "secret_path": false, "token_ttl": false,
		"user": false, "key": false, "public_key": false, "passwordless": false, "": false,
	} {
		if got := sensitiveKey([]byte(key)); got != want {
			t.Errorf("sensitiveKey(%q) = %v, want %v", key, got, want)
		}
	}
}

// TestRedactLinear feeds inputs that would make a backtracking or
// rescanning redactor quadratic; each must finish quickly.
func TestRedactLinear(t *testing.T) {
	const n = 2 << 20
	for name, unit := range map[string]string{
		"begin":        "-----BEGIN ",
		"begin key":    "-----BEGIN PRIVATE KEY-----",
		"end":          "-----END PRIVATE KEY-----",
		"label":        "-----BEGIN AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"separators":   "token=",
		"quoted":       `token="`,
		"redacted":     `token="[REDACTED] `,
		"keys":         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa=",
		"colons":       "password:",
		"jwt prefixes": "eyJ.eyJ.",
		"url":          "a://b:c",
		"bearer":       "Authorization: Bearer ",
		"at":           "x://u:p@",
	} {
		t.Run(name, func(t *testing.T) {
			in := bytes.Repeat([]byte(unit), n/len(unit))
			start := time.Now()
			Redact(in)
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("Redact of %d bytes of %q took %v", len(in), unit, d)
			}
		})
	}
}

// FuzzRedact checks that Redact never panics, never modifies its input,
// leaves none of the input's join tokens or private key BEGIN lines, and
// finds nothing more to redact in its own output.
func FuzzRedact(f *testing.F) {
	joinTokenRE := regexp.MustCompile(`bcjt_[A-Za-z0-9_-]+`)
	keyHeaderRE := regexp.MustCompile(`^-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----`)
	for _, s := range []string{
		"BCD_JOIN_TOKEN=bcjt_jt_01_abc\n",
		"-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n",
		"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY----------BEGIN PRIVATE KEY-----\nBBBB",
		"postgres://u:p@h/db Authorization: Bearer x",
		`{"password": "x", "token":"y"} eyJa.eyJb.c`,
		"key: value\ntoken: 'abc\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		orig := bytes.Clone(in)
		out := Redact(in)
		if !bytes.Equal(in, orig) {
			t.Fatal("Redact modified its input")
		}
		for _, tok := range joinTokenRE.FindAll(in, -1) {
			if bytes.Contains(out, tok) {
				t.Fatalf("Redact(%q) = %q keeps the join token %q", in, out, tok)
			}
		}
		for i := 0; ; i++ {
			k := bytes.Index(in[i:], []byte("-----BEGIN "))
			if k < 0 {
				break
			}
			i += k
			if hdr := keyHeaderRE.Find(in[i:]); hdr != nil && bytes.Contains(out, hdr) {
				t.Fatalf("Redact(%q) = %q keeps the private key header %q", in, out, hdr)
			}
		}
		if again := Redact(out); !bytes.Equal(again, out) {
			t.Fatalf("Redact is not idempotent on %q: %q", out, again)
		}
	})
}

func TestRedactIdempotentExamples(t *testing.T) {
	for _, s := range []string{
		"Authorization: Bearer x\npassword=y bcjt_a eyJa.eyJb.c",
		"redis://:s3cret@cache:6379 token='abc",
	} {
		once := Redact([]byte(s))
		if twice := Redact(once); !bytes.Equal(once, twice) {
			t.Errorf("Redact(Redact(%q)) = %q, want %q", s, twice, once)
		}
	}
	if strings.Contains(string(Redact([]byte("x"))), Redacted) {
		t.Error("Redact added text to clean input")
	}
}
