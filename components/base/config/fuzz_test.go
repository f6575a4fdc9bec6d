package config

import (
	"reflect"
	"testing"
)

func FuzzParse(f *testing.F) {
	seeds := []string{
		``,
		`gateway = "https://gw.example.com"`,
		"gateway = \"https://10.0.0.1\"\ngateway_server_name = \"gw\"\nserving_ca_spki_pin = \"" + pinA + "\"\n[log]\nlevel = \"debug\"\n[helper]\nsocket = \"/run/h.sock\"\nuser = \"bcd\"\n",
		"[log]\ncolour = 1",
		`gateway.urll = 1`,
		"[[log]]\nlevel = 1",
		`log = { level = "warn", format = "text" }`,
		"site = '''\nx'''",
		"Gateway = \"https://x\"",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.toml")
		if err != nil {
			return
		}
		// Whatever parses must encode and parse back to the same thing.
		out, err := c.Marshal()
		if err != nil {
			t.Fatalf("Marshal of a parsed config: %v", err)
		}
		c2, err := Parse(out, "fuzz.toml")
		if err != nil {
			t.Fatalf("Parse(Marshal()): %v\n%s", err, out)
		}
		if !reflect.DeepEqual(c, c2) {
			t.Fatalf("round trip changed the config:\n%+v\n%+v", *c, *c2)
		}
	})
}
