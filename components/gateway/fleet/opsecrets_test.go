package fleet

import (
	"strings"
	"testing"
)

// FuzzCanonicalSecretName: whatever an operator types as a secret's
// name, an accepted one is telemetry-header/ and a header token, and its
// canonical form is accepted as itself; an error never panics.
func FuzzCanonicalSecretName(f *testing.F) {
	for _, s := range []string{"telemetry-header/authorization", "telemetry-header/X-API-Key", "telemetry-header/", "bmc-credentials",
		"telemetry-header/Content-Type", "telemetry-header/a b", "telemetry-header/\xff", "http-header/Authorization"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		c, err := CanonicalSecretName(name)
		if err != nil {
			return
		}
		h, ok := strings.CutPrefix(c, SecretTelemetryHeader)
		if !ok || h == "" || !headerToken(h) || !strings.EqualFold(c, name) {
			t.Fatalf("%q accepted as %q", name, c)
		}
		if again, err := CanonicalSecretName(c); err != nil || again != c {
			t.Fatalf("canonical %q is not itself: %q %v", c, again, err)
		}
	})
}

// TestSecretValues: a header value is one line of printable ASCII, 1 to
// 8192 bytes; the errors never hold it.
func TestSecretValues(t *testing.T) {
	for _, c := range []struct {
		v  string
		ok bool
	}{
		{"Bearer abc.def", true},
		{strings.Repeat("a", maxSecretValue), true},
		{strings.Repeat("a", maxSecretValue+1), false},
		{"", false},
		{"Bearer s3cret\r\nX-Evil: 1", false},
		{"tab\there", false},
		{"caf\xc3\xa9", false},
	} {
		err := checkSecretValue([]byte(c.v))
		if (err == nil) != c.ok {
			t.Errorf("%q: %v", c.v, err)
		}
		if err != nil && len(c.v) > 3 && strings.Contains(err.Error(), c.v) {
			t.Errorf("the error holds the value: %v", err)
		}
	}
}
