package httpsurl

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tt := range []struct{ in, wantErr string }{
		{"https://images.example/debian.qcow2", ""},
		{"https://127.0.0.1:8443/a?sig=x", ""},
		{"http://images.example/a", "https://"},
		{"file:///etc/shadow", "https://"},
		{"https:///nohost", "no host"},
		{"/relative", "https://"},
		{"https://a b/\x7f", "not a URL"},
	} {
		err := Check(tt.in)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("Check(%q) = %v, want %q", tt.in, err, tt.wantErr)
		}
	}
}

func TestRedact(t *testing.T) {
	const secret = "X-Amz-Signature=abc"
	in := "https://user:pw@images.example/a.qcow2?" + secret + "#frag"
	if got := Redact(in); got != "https://images.example/a.qcow2" {
		t.Errorf("Redact = %q", got)
	}
	err := RedactErr(&url.Error{Op: "Get", URL: in, Err: errors.New("refused")}, in)
	if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "pw") {
		t.Errorf("RedactErr kept the secret: %v", err)
	}
}
