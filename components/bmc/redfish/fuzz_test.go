package redfish

import (
	"encoding/json"
	"os"
	"path"
	"strings"
	"testing"
)

// FuzzParseSystem feeds a BMC's ComputerSystem body through the client's
// parsing: it must never panic, and every link it would follow must resolve
// under /redfish/v1 on the BMC's own host or be refused.
func FuzzParseSystem(f *testing.F) {
	seed, err := os.ReadFile("redfishtest/testdata/public-rackmount1/Systems/437XR1138R2/index.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"@odata.id":"/redfish/v1/../../etc","Processors":{"@odata.id":"https://evil.example/redfish/v1/x"}}`))
	f.Add([]byte(`{"Memory":{"@odata.id":"//evil.example/redfish/v1"},"Bios":{"@odata.id":"/redfish/v1/%2e%2e/%2e%2e/x"}}`))
	f.Add([]byte(`{"ProcessorSummary":{"Count":"2"},"MemorySummary":{"TotalSystemMemoryGiB":"1e400"}}`))
	f.Add([]byte(`{"Links":{"ManagedBy":[{"@odata.id":"https://10.0.0.5:443/redfish/v1/Managers/1?$expand=."}]}}`))
	const host = "10.0.0.5:443"
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseSystem(b)
		if err != nil {
			return
		}
		sum := s.summary()
		if out, err := json.Marshal(sum); err != nil {
			t.Fatalf("summary does not marshal: %v", err)
		} else if strings.ContainsAny(string(out), "\x00\n\r") {
			t.Fatalf("control characters in %s", out)
		}
		for _, l := range s.links() {
			p, q, err := resolveLink(host, l)
			if err != nil {
				continue
			}
			if c := path.Clean(p); !underRoot(c) || strings.TrimSuffix(p, "/") != c {
				t.Fatalf("link %q resolved to %q outside %s", l, p, Root)
			}
			if strings.ContainsAny(q, "#\x00") {
				t.Fatalf("link %q kept query %q", l, q)
			}
		}
		_, _ = resetTypeFor(PowerCycle, s.PowerState, s.Actions.Reset.Allowed)
	})
}

func TestResolveLink(t *testing.T) {
	const host = "10.0.0.5:443"
	ok := map[string]string{
		"/redfish/v1":                          "/redfish/v1",
		"/redfish/v1/":                         "/redfish/v1/",
		"/redfish/v1/Systems/1":                "/redfish/v1/Systems/1",
		"/redfish/v1/Systems/1/../2":           "/redfish/v1/Systems/2",
		"https://10.0.0.5/redfish/v1/Systems":  "/redfish/v1/Systems",
		"https://10.0.0.5:443/redfish/v1/X#/Y": "/redfish/v1/X",
	}
	for in, want := range ok {
		got, _, err := resolveLink(host, in)
		if err != nil || got != want {
			t.Errorf("resolveLink(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"", "/redfish/v10/Systems", "/redfish", "/redfish/v1/../v2", "/redfish/v1/../../etc/passwd",
		"https://10.0.0.6/redfish/v1", "http://10.0.0.5/redfish/v1", "//evil/redfish/v1", "https://10.0.0.5:8443/redfish/v1",
		"https://user@10.0.0.5/redfish/v1", "redfish/v1/Systems", "/redfish/v1/a\\b", "/redfish/v1/a b", "/redfish/v1/\x00",
		"mailto:x@y", "/redfish/v1/%2e%2e/%2e%2e/x",
	} {
		if got, _, err := resolveLink(host, bad); err == nil {
			t.Errorf("resolveLink(%q) = %q; want refused", bad, got)
		}
	}
}

func TestSecretBody(t *testing.T) {
	b := secretBody([]byte("UserName"), []byte(`a"dm\in`), []byte("Password"), []byte("p<w>&\x01\u00e9"))
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if m["UserName"] != `a"dm\in` || m["Password"] != "p<w>&\x01\u00e9" || cap(b) != len(b) {
		t.Fatalf("%s (len %d cap %d)", b, len(b), cap(b))
	}
}
