package bootparams

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"net"
	"reflect"
	"strings"
	"testing"
)

func pin(seed string) string {
	sum := sha256.Sum256([]byte(seed))
	return "sha256/" + base64.StdEncoding.EncodeToString(sum[:])
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// sample is a full set of parameters shaped like the real ones.
func sample() Params {
	return Params{
		Gateway:           "https://gw.eu-1.example.com:8443",
		ServerName:        "gw.eu-1.example.com",
		ServingCAPin:      pin("ca"),
		JoinSigningPin:    pin("signing"),
		JoinEncryptionPin: pin("encryption"),
		JWK: []byte(`{"kty":"EC","crv":"P-256","alg":"ECDH-ES+A256KW",` +
			`"x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}`),
		DiscoveryToken: "bcdt_01HZX8Q4M3K2R9T7V6W5Y4A3B2",
		Assertion: b64(`{"alg":"ES256","typ":"bcd-discovery+jws"}`) + "." +
			b64(`{"site":"fsn1","mac":"52:54:00:12:34:56","exp":1790000000}`) + "." +
			base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{7}, 64)),
		Site:     "fsn1",
		MAC:      net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56},
		CacheURL: "http://10.0.0.1:8080/images/",
	}
}

func TestRoundTrip(t *testing.T) {
	minimal := sample()
	minimal.ServerName = ""
	minimal.CacheURL = ""
	for name, p := range map[string]Params{"full": sample(), "without optional": minimal} {
		t.Run(name, func(t *testing.T) {
			s, err := Render(p)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			got, err := Parse("BOOT_IMAGE=vmlinuz console=ttyS0 panic=-1 " + s + " quiet")
			if err != nil {
				t.Fatalf("Parse(Render): %v", err)
			}
			if !reflect.DeepEqual(got, p) {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, p)
			}
		})
	}
}

func TestRenderGolden(t *testing.T) {
	p := sample()
	p.JWK = []byte(`{"kty":"EC"}`)
	p.Assertion = "eyJhbGciOiJFUzI1NiJ9.e30.c2ln"
	got, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	want := "bc.gateway=https://gw.eu-1.example.com:8443 bc.server_name=gw.eu-1.example.com " +
		"bc.ca_pin=" + pin("ca") + " bc.signing_pin=" + pin("signing") + " bc.encryption_pin=" + pin("encryption") +
		" bc.jwk=eyJrdHkiOiJFQyJ9 bc.token=bcdt_01HZX8Q4M3K2R9T7V6W5Y4A3B2" +
		" bc.assertion=eyJhbGciOiJFUzI1NiJ9.e30.c2ln bc.site=fsn1 bc.mac=52:54:00:12:34:56" +
		" bc.cache=http://10.0.0.1:8080/images/"
	if got != want {
		t.Errorf("Render:\n got %s\nwant %s", got, want)
	}
}

func TestRenderRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Params)
		want   string
	}{
		{"space in site", func(p *Params) { p.Site = "fsn 1" }, "bc.site"},
		{"quote in token", func(p *Params) { p.DiscoveryToken = `ab"c` }, "bc.token"},
		{"space in gateway", func(p *Params) { p.Gateway = "https://gw example" }, "bc.gateway"},
		{"ftp gateway", func(p *Params) { p.Gateway = "ftp://gw" }, "bc.gateway"},
		{"gateway with password", func(p *Params) { p.Gateway = "https://u:p@gw" }, "bc.gateway"},
		{"iPXE expansion in cache", func(p *Params) { p.CacheURL = "http://h/${x}" }, "bc.cache"},
		{"no MAC", func(p *Params) { p.MAC = nil }, "bc.mac"},
		{"8-byte MAC", func(p *Params) { p.MAC = make(net.HardwareAddr, 8) }, "bc.mac"},
		{"bad pin", func(p *Params) { p.JoinSigningPin = "sha1/abc" }, "bc.signing_pin"},
		{"JWK not JSON", func(p *Params) { p.JWK = []byte("nope") }, "bc.jwk"},
		{"JWK without kty", func(p *Params) { p.JWK = []byte(`{"crv":"P-256"}`) }, "bc.jwk"},
		{"JWK too long", func(p *Params) {
			p.JWK = []byte(`{"kty":"EC","x":"` + strings.Repeat("a", MaxJWKLen) + `"}`)
		}, "bc.jwk"},
		{"assertion not a JWS", func(p *Params) { p.Assertion = "a.b" }, "bc.assertion"},
		{"missing token", func(p *Params) { p.DiscoveryToken = "" }, "bc.token"},
		{"token too long", func(p *Params) { p.DiscoveryToken = strings.Repeat("a", MaxTokenLen+1) }, "bc.token"},
		{"server name with port", func(p *Params) { p.ServerName = "gw:443" }, "bc.server_name"},
		{"everything at its bound", func(p *Params) {
			p.DiscoveryToken = strings.Repeat("a", MaxTokenLen)
			p.Gateway = "https://" + strings.Repeat("g", MaxURLLen-8)
			p.CacheURL = "https://" + strings.Repeat("c", MaxURLLen-8)
			p.Assertion = b64(`{"alg":"ES256"}`) + "." + strings.Repeat("A", 600) + ".c2ln"
		}, "more than 1536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := sample()
			tc.modify(&p)
			_, err := Render(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	good, err := Render(sample())
	if err != nil {
		t.Fatal(err)
	}
	replace := func(name, value string) string {
		var out []string
		for _, w := range strings.Fields(good) {
			if strings.HasPrefix(w, Prefix+name+"=") {
				if value == "<drop>" {
					continue
				}
				w = Prefix + name + "=" + value
			}
			out = append(out, w)
		}
		return strings.Join(out, " ")
	}
	secret := "bcdt_SECRET_do_not_echo"
	for _, tc := range []struct {
		name    string
		cmdline string
		want    string
	}{
		{"missing gateway", replace(NameGateway, "<drop>"), "bc.gateway: missing"},
		{"missing assertion", replace(NameAssertion, "<drop>"), "bc.assertion: missing"},
		{"missing jwk", replace(NameJWK, "<drop>"), "bc.jwk: missing"},
		{"missing mac", replace(NameMAC, "<drop>"), "bc.mac: missing"},
		{"malformed gateway", replace(NameGateway, "gw.example.com"), "bc.gateway"},
		{"malformed pin", replace(NameServingCAPin, "sha256/AAAA"), "bc.ca_pin"},
		{"jwk padded", replace(NameJWK, b64(`{"kty":"EC"}`)+"=="), "bc.jwk"},
		{"jwk std base64", replace(NameJWK, "eyJrdHkiOiJFQyJ9+/"), "bc.jwk"},
		{"upper-case mac", replace(NameMAC, "52:54:00:AB:CD:EF"), "bc.mac"},
		{"dashed mac", replace(NameMAC, "52-54-00-12-34-56"), "bc.mac"},
		{"token with bad byte", replace(NameDiscoveryToken, secret+"!"), "bc.token"},
		{"no value", good + " bc.site", "bc.site: has no value"},
		{"empty value", replace(NameSite, ""), "bc.site"},
		{"twice", good + " bc.site=other", "bc.site: given more than once"},
		{"quoted", replace(NameSite, `"fsn1"`), "bc.site: must not be quoted"},
		{"whole word quoted", strings.Replace(good, "bc.site=fsn1", `"bc.site=fsn1"`, 1), "bc.site: must not be quoted"},
		{"malformed name", good + " bc.Site=x", "malformed name"},
		{"too long", good + " " + strings.Repeat("x", MaxCmdlineLen), "more than 8192"},
		{"empty", "", "bc.gateway: missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.cmdline)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the error echoes the token: %v", err)
			}
		})
	}
}

func TestParseIgnores(t *testing.T) {
	good, err := Render(sample())
	if err != nil {
		t.Fatal(err)
	}
	for name, cmdline := range map[string]string{
		"other words":               "root=/dev/ram0 " + good + " console=ttyS0,115200 bcx=1 abc.site=x",
		"unknown bc name":           good + " bc.future_thing=1",
		"a quoted value of another": `dyndbg="file foo.c bc.site=evil +p" ` + good,
		"tabs and newlines":         strings.ReplaceAll(good, " ", "\t") + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(cmdline)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, sample()) {
				t.Errorf("Parse = %+v", got)
			}
		})
	}
}

func TestSplitCmdline(t *testing.T) {
	for in, want := range map[string][]string{
		"":                    nil,
		"  a  b ":             {"a", "b"},
		`a="x y" b`:           {`a="x y"`, "b"},
		`"a b" c`:             {`"a b"`, "c"},
		"a\tb\nc":             {"a", "b", "c"},
		`unterminated="x y z`: {`unterminated="x y z`},
	} {
		if got := splitCmdline(in); !reflect.DeepEqual(got, want) {
			t.Errorf("splitCmdline(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzParse: Parse never panics, and what it accepts renders (when it fits)
// and parses back to the same parameters.
func FuzzParse(f *testing.F) {
	good, err := Render(sample())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add("console=ttyS0 " + good)
	f.Add(`bc.site="x y" bc.mac=52:54:00:12:34:56`)
	f.Add("bc.gateway=https://gw bc.jwk=e30 bc.assertion=a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, cmdline string) {
		p, err := Parse(cmdline)
		if err != nil {
			return
		}
		s, err := Render(p)
		if err != nil {
			if strings.Contains(err.Error(), "more than") {
				return // accepted piecewise, too long as a whole
			}
			t.Fatalf("Render of parsed parameters: %v", err)
		}
		back, err := Parse(s)
		if err != nil {
			t.Fatalf("Parse(Render(Parse(x))): %v", err)
		}
		if !reflect.DeepEqual(back, p) {
			t.Fatalf("round trip changed the parameters:\n got %+v\nwant %+v", back, p)
		}
	})
}
