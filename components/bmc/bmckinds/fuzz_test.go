package bmckinds

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzCredentials checks the credentials parser, which avoids strings, against
// encoding/json, and the escaper the scrubber uses against json.Marshal.
func FuzzCredentials(f *testing.F) {
	f.Add([]byte(`{"username":"root","password":"calvin"}`))
	f.Add([]byte(`{"username":"r\u00e9","password":"\ud83d\ude00\ud800x\"\\\/\b\f\n\r\t"}`))
	f.Add([]byte(`{"username":"a","password":"b","x":1}`))
	f.Add([]byte(`{"username":"a","password":"\udc00\ud800\ud800\udc00"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := parseCredentials(bytes.Clone(raw))
		var want map[string]any
		if json.Unmarshal(raw, &want) != nil {
			if err == nil {
				t.Fatalf("parsed invalid JSON %q", raw)
			}
			return
		}
		u, okU := want["username"].(string)
		p, okP := want["password"].(string)
		valid := len(want) == 2 && okU && okP && u != "" && p != ""
		if valid != (err == nil) {
			t.Fatalf("%q: valid=%v err=%v", raw, valid, err)
		}
		if err != nil {
			return
		}
		// encoding/json replaces invalid UTF-8 with U+FFFD; unquote keeps the
		// bytes. Compare where the input was valid.
		if utf8.Valid(raw) && (string(got.username) != u || string(got.password) != p) {
			t.Fatalf("%q: got %q/%q, want %q/%q", raw, got.username, got.password, u, p)
		}
		for _, s := range []string{u, p} {
			enc, _ := json.Marshal(s)
			if esc := jsonEscape([]byte(s), true); !bytes.Equal(esc, enc[1:len(enc)-1]) {
				t.Fatalf("jsonEscape(%q) = %s, json.Marshal = %s", s, esc, enc)
			}
		}
	})
}
