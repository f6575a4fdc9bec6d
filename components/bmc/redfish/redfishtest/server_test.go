package redfishtest

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/trust/pki"
)

// raw is a client that checks the server's pin itself.
func raw(t *testing.T, s *Server) *http.Client {
	t.Helper()
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, // checked against the pin below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if pki.PinOfCert(cs.PeerCertificates[0]) != s.Pin() {
				return errors.New("pin mismatch")
			}
			return nil
		},
	}}}
}

func do(t *testing.T, s *Server, method, path, body string, set func(*http.Request)) (int, map[string]any, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if set != nil {
		set(req)
	}
	resp, err := raw(t, s).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m, resp.Header
}

func TestServer(t *testing.T) {
	s := Start(t, Options{})
	basic := func(r *http.Request) { r.SetBasicAuth("Administrator", DefaultPassword) }
	if code, m, _ := do(t, s, "GET", "/redfish/v1/", "", nil); code != 200 || m["RedfishVersion"] != "1.15.0" {
		t.Fatalf("service root: %d %v", code, m)
	}
	if code, _, _ := do(t, s, "GET", System, "", nil); code != 401 {
		t.Fatalf("system without credentials: %d", code)
	}
	if code, _, _ := do(t, s, "GET", System, "", func(r *http.Request) { r.SetBasicAuth("Administrator", "nope") }); code != 401 {
		t.Fatalf("system with a wrong password: %d", code)
	}
	code, m, _ := do(t, s, "GET", System, "", basic)
	if code != 200 || m["PowerState"] != "On" {
		t.Fatalf("system: %d %v", code, m["PowerState"])
	}
	code, _, h := do(t, s, "POST", Sessions, `{"UserName":"Administrator","Password":"`+DefaultPassword+`"}`, nil)
	tok := h.Get("X-Auth-Token")
	if code != 201 || tok == "" || s.LiveSessions() != 1 {
		t.Fatalf("login: %d token %q", code, tok)
	}
	withTok := func(r *http.Request) { r.Header.Set("X-Auth-Token", tok) }
	if code, _, _ := do(t, s, "POST", System+"/Actions/ComputerSystem.Reset", `{"ResetType":"ForceOff"}`, withTok); code != 204 || s.PowerState() != "Off" {
		t.Fatalf("ForceOff: %d, power %s", code, s.PowerState())
	}
	if code, _, _ := do(t, s, "POST", System+"/Actions/ComputerSystem.Reset", `{"ResetType":"PowerCycle"}`, withTok); code != 400 {
		t.Fatalf("PowerCycle is not in the mockup's list, got %d", code)
	}
	if code, _, _ := do(t, s, "PATCH", System, `{"Boot":{"BootSourceOverrideTarget":"Hdd"}}`, withTok); code != 204 {
		t.Fatalf("boot patch: %d", code)
	}
	if tgt, en := s.Boot(); tgt != "Hdd" || en != "Once" {
		t.Fatalf("boot %s %s", tgt, en)
	}
	if code, _, _ := do(t, s, "PATCH", System, `{"Boot":{"BootSourceOverrideTarget":"Hdd"}}`, func(r *http.Request) {
		withTok(r)
		r.Header.Set("If-Match", `"stale"`)
	}); code != 412 {
		t.Fatalf("stale If-Match: %d", code)
	}
	code, _, _ = do(t, s, "DELETE", Sessions+"/S0001", "", withTok)
	if code != 204 || s.LiveSessions() != 0 {
		t.Fatalf("logout: %d", code)
	}
	if code, _, _ := do(t, s, "GET", System, "", withTok); code != 401 {
		t.Fatalf("deleted token still works: %d", code)
	}
	if code, _, _ := do(t, s, "GET", Root+"/Chassis", "", basic); code != 404 {
		t.Fatalf("a resource not kept: %d", code)
	}
}

func TestPinsDiffer(t *testing.T) {
	a, b := Start(t, Options{}), Start(t, Options{})
	if a.Pin() == b.Pin() {
		t.Fatal("two servers share a key")
	}
}
