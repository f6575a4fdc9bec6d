package bmckinds

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/bmc/redfish"
	"github.com/better-compute/bcd/components/bmc/redfish/redfishtest"
	"github.com/better-compute/bcd/components/trust/pki"
)

// A password with characters JSON escapes, so scrubbing of both forms is
// exercised.
const testPassword = `s3cr<et>&"pw`

type fakeSecrets struct {
	mu     sync.Mutex
	values map[string][]byte
	calls  []string
	handed [][]byte
}

func (f *fakeSecrets) Secret(_ context.Context, name, workflowID, commandID string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	v, ok := f.values[name]
	if !ok {
		return nil, fmt.Errorf("secret %s: the gateway refused: not bound to this step", name)
	}
	b := bytes.Clone(v)
	f.handed = append(f.handed, b)
	return b, nil
}

// zeroed reports whether every secret handed out was zeroed.
func (f *fakeSecrets) zeroed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.handed {
		if slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) {
			return false
		}
	}
	return true
}

func credsJSON(user, pw string) []byte {
	b, _ := json.Marshal(map[string]string{"username": user, "password": pw})
	return b
}

type env struct {
	srv     *redfishtest.Server
	cfg     Config
	secrets *fakeSecrets
	ctx     context.Context
}

func setup(t *testing.T, opts redfishtest.Options) *env {
	t.Helper()
	opts.Password = testPassword
	srv := redfishtest.Start(t, opts)
	nets, err := ParseNetworks([]string{"127.0.0.0/8", "10.1.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSecrets{values: map[string][]byte{CredentialsSecret: credsJSON(srv.Username(), testPassword)}}
	return &env{srv: srv, cfg: Config{Networks: nets}, secrets: f, ctx: session.WithSecrets(context.Background(), f)}
}

func (e *env) bmc() string {
	b, _ := json.Marshal(BMC{Address: e.srv.Addr(), SPKIPin: e.srv.Pin()})
	return string(b)
}

// run runs a kind as the dispatcher would: its Resources, then its Run.
func (e *env) run(t *testing.T, name, body string) (json.RawMessage, error) {
	t.Helper()
	for _, k := range Kinds(e.cfg) {
		if k.Name != name {
			continue
		}
		res, err := k.Resources([]byte(body))
		if err == nil && (len(res) != 1 || !strings.HasPrefix(res[0], "bmc:")) {
			t.Fatalf("resources %v", res)
		}
		out, err := k.Run(e.ctx, []byte(body))
		if err != nil && strings.Contains(err.Error(), testPassword) {
			t.Fatalf("the password is in the error: %v", err)
		}
		if bytes.Contains(out, []byte(testPassword)) || bytes.Contains(out, jsonEscape([]byte(testPassword), true)) {
			t.Fatalf("the password is in the result: %s", out)
		}
		if !e.secrets.zeroed() {
			t.Fatalf("%s left a secret unzeroed", name)
		}
		return out, err
	}
	t.Fatalf("no kind %s", name)
	return nil, nil
}

func decodeInto[T any](t *testing.T, out json.RawMessage) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("result %s: %v", out, err)
	}
	return v
}

func TestKindsTable(t *testing.T) {
	var names []string
	for _, k := range Kinds(Config{}) {
		names = append(names, k.Name)
		if k.Run == nil || k.Resources == nil || k.Lane != dispatch.LaneControl {
			t.Errorf("%s: incomplete", k.Name)
		}
	}
	want := []string{KindPower, KindBootDevice, KindInspect, KindVirtualMedia, KindFirmwareInventory, KindRotateCredentials, KindBIOS}
	if !slices.Equal(names, want) {
		t.Fatalf("kinds %v", names)
	}
}

func TestPower(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	out, err := e.run(t, KindPower, `{"bmc":`+e.bmc()+`,"action":"cycle"}`)
	if err != nil {
		t.Fatal(err)
	}
	res := decodeInto[PowerResult](t, out)
	// The mockup allows no PowerCycle: off, then on, never a warm restart.
	if res.ResetType != "ForceOff,On" || res.PowerState != "On" || e.srv.Cycles() != 0 {
		t.Fatalf("result %+v, server cycles %d", res, e.srv.Cycles())
	}
	if got := e.srv.Resets(); !slices.Equal(got, []string{"ForceOff", "On"}) {
		t.Fatalf("server resets %v", got)
	}
	if _, err := e.run(t, KindPower, `{"bmc":`+e.bmc()+`,"action":"off"}`); err != nil || e.srv.PowerState() != "Off" {
		t.Fatalf("off: %v, server %s", err, e.srv.PowerState())
	}
	out, err = e.run(t, KindPower, `{"bmc":`+e.bmc()+`,"action":"status"}`)
	if err != nil || decodeInto[PowerResult](t, out).PowerState != "Off" {
		t.Fatalf("status: %s %v", out, err)
	}
	if _, err := e.run(t, KindPower, `{"bmc":`+e.bmc()+`,"action":"on"}`); err != nil || e.srv.PowerState() != "On" {
		t.Fatalf("on: %v, server %s", err, e.srv.PowerState())
	}
	if e.srv.LiveSessions() != 0 {
		t.Fatalf("%d sessions left open", e.srv.LiveSessions())
	}
	for _, c := range e.secrets.calls {
		if c != CredentialsSecret {
			t.Fatalf("asked for %s", c)
		}
	}
}

func TestBootDevice(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	_, err := e.run(t, KindBootDevice, `{"bmc":`+e.bmc()+`,"device":"disk","once":false}`)
	if err != nil {
		t.Fatal(err)
	}
	if tgt, en := e.srv.Boot(); tgt != "Hdd" || en != "Continuous" {
		t.Fatalf("server %s/%s", tgt, en)
	}
	out, err := e.run(t, KindBootDevice, `{"bmc":`+e.bmc()+`,"device":"pxe","once":true}`)
	if err != nil {
		t.Fatal(err)
	}
	if tgt, en := e.srv.Boot(); tgt != "Pxe" || en != "Once" {
		t.Fatalf("server %s/%s", tgt, en)
	}
	if r := decodeInto[BootResult](t, out); r.Target != "Pxe" || r.Enabled != "Once" {
		t.Fatalf("result %+v", r)
	}
}

func TestInspect(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	out, err := e.run(t, KindInspect, `{"bmc":`+e.bmc()+`}`)
	if err != nil {
		t.Fatal(err)
	}
	inv := decodeInto[redfish.Inventory](t, out)
	var macs []string
	for _, n := range inv.NICs {
		macs = append(macs, n.MAC, n.PermanentMAC)
	}
	for _, want := range []string{"12:44:6a:3b:04:11", "12:44:6a:3b:88:90", "aa:bb:cc:dd:ee:00"} {
		if !slices.Contains(macs, want) {
			t.Errorf("MACs %v lack %s", macs, want)
		}
	}
	if inv.System.SerialNumber != "437XR1138R2" || len(inv.Memory) != 3 || len(inv.Storage) != 2 {
		t.Fatalf("inventory %s", out)
	}
}

func TestVirtualMedia(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	out, err := e.run(t, KindVirtualMedia, `{"bmc":`+e.bmc()+`,"action":"insert","image_url":"https://cache.site/boot.iso"}`)
	if err != nil {
		t.Fatal(err)
	}
	if img, in := e.srv.Media(); img != "https://cache.site/boot.iso" || !in {
		t.Fatalf("server %s %v", img, in)
	}
	if r := decodeInto[MediaResult](t, out); !r.Media.Inserted || r.Media.Image != "https://cache.site/boot.iso" {
		t.Fatalf("result %s", out)
	}
	if _, err := e.run(t, KindVirtualMedia, `{"bmc":`+e.bmc()+`,"action":"eject"}`); err != nil {
		t.Fatal(err)
	}
	if _, in := e.srv.Media(); in {
		t.Fatal("still inserted")
	}
}

func TestFirmwareInventory(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	out, err := e.run(t, KindFirmwareInventory, `{"bmc":`+e.bmc()+`}`)
	if err != nil {
		t.Fatal(err)
	}
	if r := decodeInto[FirmwareResult](t, out); len(r.Firmware) != 3 || r.Firmware[2].Version != "P79 v1.45" {
		t.Fatalf("result %s", out)
	}
}

func TestRotateCredentials(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	const newPW = `n3w<pass>"word`
	e.secrets.values[NewPasswordSecret] = []byte(newPW)
	out, err := e.run(t, KindRotateCredentials, `{"bmc":`+e.bmc()+`}`)
	if err != nil {
		t.Fatal(err)
	}
	if r := decodeInto[RotateResult](t, out); !r.Rotated || !r.Verified {
		t.Fatalf("result %s", out)
	}
	if e.srv.Password() != newPW {
		t.Fatal("the server's password did not change")
	}
	if bytes.Contains(out, []byte("n3w")) {
		t.Fatalf("the new password is in the result: %s", out)
	}
	// The old credentials no longer work.
	_, err = e.run(t, KindPower, `{"bmc":`+e.bmc()+`,"action":"status"}`)
	if redfish.StatusOf(err) != 401 {
		t.Fatalf("old credentials: %v; want 401", err)
	}
	e.secrets.values[CredentialsSecret] = credsJSON(e.srv.Username(), newPW)
	if _, err := e.run(t, KindPower, `{"bmc":`+e.bmc()+`,"action":"status"}`); err != nil {
		t.Fatalf("new credentials: %v", err)
	}
}

func TestRotateCredentialsRefused(t *testing.T) {
	e := setup(t, redfishtest.Options{Misbehave: redfishtest.EchoCredentials})
	const newPW = "Echoed-Back-1"
	e.secrets.values[NewPasswordSecret] = []byte(newPW)
	_, err := e.run(t, KindRotateCredentials, `{"bmc":`+e.bmc()+`}`)
	if err == nil || strings.Contains(err.Error(), newPW) || !strings.Contains(err.Error(), "[redacted]") {
		t.Fatalf("err %v", err)
	}
	if e.srv.Password() != testPassword {
		t.Fatal("the password changed")
	}
	delete(e.secrets.values, NewPasswordSecret)
	if _, err := e.run(t, KindRotateCredentials, `{"bmc":`+e.bmc()+`}`); err == nil || !strings.Contains(err.Error(), NewPasswordSecret) {
		t.Fatalf("no new password: %v", err)
	}
	e.secrets.values[NewPasswordSecret] = []byte(testPassword)
	if _, err := e.run(t, KindRotateCredentials, `{"bmc":`+e.bmc()+`}`); err == nil {
		t.Fatal("rotation to the same password accepted")
	}
}

func TestBIOS(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	out, err := e.run(t, KindBIOS, `{"bmc":`+e.bmc()+`,"action":"get"}`)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeInto[BIOSResult](t, out)
	if r.BIOS == nil || r.BIOS.Attributes["BootMode"] != "Uefi" {
		t.Fatalf("result %s", out)
	}
	if _, err := e.run(t, KindBIOS, `{"bmc":`+e.bmc()+`,"action":"set","attributes":{"ProcCoreDisable":2,"UsbControl":"UsbDisabled"}}`); err != nil {
		t.Fatal(err)
	}
	_, pend := e.srv.BIOS()
	if fmt.Sprint(pend["ProcCoreDisable"]) != "2" || pend["UsbControl"] != "UsbDisabled" {
		t.Fatalf("server pending %v", pend)
	}
	for _, bad := range []string{
		`{"bmc":` + e.bmc() + `,"action":"set"}`,
		`{"bmc":` + e.bmc() + `,"action":"set","attributes":{"A":{"x":1}}}`,
		`{"bmc":` + e.bmc() + `,"action":"set","attributes":{"bad name":1}}`,
		`{"bmc":` + e.bmc() + `,"action":"get","attributes":{"A":1}}`,
		`{"bmc":` + e.bmc() + `,"action":"reset"}`,
	} {
		if _, err := e.run(t, KindBIOS, bad); err == nil || !strings.HasPrefix(err.Error(), "body:") {
			t.Errorf("%s: %v; want a body error", bad, err)
		}
	}
	if _, err := e.run(t, KindBIOS, `{"bmc":`+e.bmc()+`,"action":"set","attributes":{"NoSuch":1}}`); err == nil {
		t.Fatal("an attribute the BIOS lacks was accepted")
	}
}

func TestWrongPinBeforeCredentials(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pin, _ := pki.Pin(k.Public())
	body, _ := json.Marshal(map[string]any{"bmc": BMC{Address: e.srv.Addr(), SPKIPin: pin}, "action": "status"})
	_, err := e.run(t, KindPower, string(body))
	if !errors.Is(err, redfish.ErrPinMismatch) {
		t.Fatalf("err %v; want a pin mismatch", err)
	}
	if n := len(e.srv.Requests()); n != 0 {
		t.Fatalf("the BMC saw %d requests", n)
	}
	if len(e.secrets.calls) != 0 {
		t.Fatalf("credentials were fetched for a BMC that failed its pin: %v", e.secrets.calls)
	}
}

// TestLegacyTLS: a BMC offering only TLS 1.2 with RSA key exchange is
// refused before any secret is asked for unless the body carries the
// enrolment's legacy_tls; with it, the command runs, and a wrong pin is
// still refused before the credentials.
func TestLegacyTLS(t *testing.T) {
	e := setup(t, redfishtest.Options{LegacyTLS: true})
	body := func(b BMC) string {
		out, _ := json.Marshal(map[string]any{"bmc": b, "action": "status"})
		return string(out)
	}
	_, err := e.run(t, KindPower, body(BMC{Address: e.srv.Addr(), SPKIPin: e.srv.Pin()}))
	if err == nil || !strings.Contains(err.Error(), "legacy TLS") {
		t.Fatalf("without legacy_tls: %v; want refused naming legacy TLS", err)
	}
	if len(e.secrets.calls) != 0 || len(e.srv.Requests()) != 0 {
		t.Fatalf("secrets %v, requests %d before the TLS refusal", e.secrets.calls, len(e.srv.Requests()))
	}
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	wrong, _ := pki.Pin(k.Public())
	if _, err := e.run(t, KindPower, body(BMC{Address: e.srv.Addr(), SPKIPin: wrong, LegacyTLS: true})); !errors.Is(err, redfish.ErrPinMismatch) {
		t.Fatalf("legacy_tls with a wrong pin: %v", err)
	}
	if len(e.secrets.calls) != 0 {
		t.Fatalf("credentials fetched for a mispinned legacy BMC: %v", e.secrets.calls)
	}
	out, err := e.run(t, KindPower, body(BMC{Address: e.srv.Addr(), SPKIPin: e.srv.Pin(), LegacyTLS: true}))
	if err != nil || decodeInto[PowerResult](t, out).PowerState != "On" {
		t.Fatalf("with legacy_tls: %s, %v", out, err)
	}
}

func TestNetworks(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	_, port := e.srv.HostPort()
	for _, tc := range []struct {
		name string
		cfg  Config
		addr string
	}{
		{"outside", e.cfg, "192.168.0.7:" + port},
		{"outside, loopback not listed", Config{Networks: mustNets(t, "10.0.0.0/8")}, e.srv.Addr()},
		{"no networks configured", Config{}, e.srv.Addr()},
		{"a name, not an address", e.cfg, "localhost:" + port},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.cfg = tc.cfg
			body, _ := json.Marshal(map[string]any{"bmc": BMC{Address: tc.addr, SPKIPin: e.srv.Pin()}, "action": "on"})
			_, err := e.run(t, KindPower, string(body))
			if err == nil || !strings.Contains(err.Error(), "bmc_networks") && !strings.Contains(err.Error(), "IP address") {
				t.Fatalf("err %v", err)
			}
			if n := len(e.srv.Requests()); n != 0 || len(e.secrets.calls) != 0 {
				t.Fatalf("%d requests, secrets %v", n, e.secrets.calls)
			}
		})
	}
	nets := mustNets(t, "10.1.2.3", "fd00::/8")
	if !nets[0].Contains([]byte{10, 1, 2, 3}) || nets[0].Contains([]byte{10, 1, 2, 4}) {
		t.Fatalf("single address parsed as %v", nets[0])
	}
	if _, err := ParseNetworks([]string{"10.0.0.0/33"}); err == nil {
		t.Fatal("a bad prefix parsed")
	}
}

func mustNets(t *testing.T, s ...string) []*net.IPNet {
	t.Helper()
	n, err := ParseNetworks(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLinkOutsideRoot(t *testing.T) {
	for _, m := range []redfishtest.Misbehavior{redfishtest.LinkOutsideRoot, redfishtest.LinkOtherHost, redfishtest.RedirectOtherHost} {
		e := setup(t, redfishtest.Options{Misbehave: m})
		_, err := e.run(t, KindPower, `{"bmc":`+e.bmc()+`,"action":"off"}`)
		if !errors.Is(err, redfish.ErrOutsideRoot) {
			t.Fatalf("misbehavior %d: %v", m, err)
		}
		if e.srv.PowerState() != "On" {
			t.Fatal("the power changed")
		}
		for _, r := range e.srv.Requests() {
			if !strings.HasPrefix(r.Path, redfishtest.Root) {
				t.Fatalf("requested %s", r.Path)
			}
		}
	}
}

func TestCredentialsNeverLeak(t *testing.T) {
	e := setup(t, redfishtest.Options{Misbehave: redfishtest.EchoCredentials})
	wrong := `wr0ng<"pw>`
	e.secrets.values[CredentialsSecret] = credsJSON(e.srv.Username(), wrong)
	if _, err := e.run(t, KindInspect, `{"bmc":`+e.bmc()+`}`); err == nil || strings.Contains(err.Error(), "wr0ng") {
		t.Fatalf("err %v", err)
	}
	e2 := setup(t, redfishtest.Options{NoSessions: true, Misbehave: redfishtest.EchoCredentials})
	e2.secrets.values[CredentialsSecret] = credsJSON(e2.srv.Username(), wrong)
	if _, err := e2.run(t, KindInspect, `{"bmc":`+e2.bmc()+`}`); err == nil || strings.Contains(err.Error(), "wr0ng") {
		t.Fatalf("basic auth: err %v", err)
	}
	// Malformed credentials are refused without quoting them.
	for _, bad := range []string{`{"username":"u","password":"hunter2x","extra":1}`, `{"username":"u"}`, `hunter2x`, `{"username":"u","password":7}`} {
		e.secrets.values[CredentialsSecret] = []byte(bad)
		_, err := e.run(t, KindInspect, `{"bmc":`+e.bmc()+`}`)
		if err == nil || strings.Contains(err.Error(), "hunter2x") {
			t.Fatalf("%s: err %v", bad, err)
		}
	}
	// No session in the context: refused, nothing sent.
	e3 := setup(t, redfishtest.Options{})
	e3.ctx = context.Background()
	if _, err := e3.run(t, KindInspect, `{"bmc":`+e3.bmc()+`}`); err == nil || !strings.Contains(err.Error(), "no session") {
		t.Fatalf("no secrets: %v", err)
	}
}

func TestStrictBodies(t *testing.T) {
	e := setup(t, redfishtest.Options{})
	bmc := e.bmc()
	for kind, bodies := range map[string][]string{
		KindPower: {
			`{"bmc":` + bmc + `,"action":"on","password":"x"}`,
			`{"bmc":{"address":"127.0.0.1","spki_pin":"` + e.srv.Pin() + `","username":"root"},"action":"on"}`,
			`{"bmc":` + bmc + `,"action":"reset"}`,
			`{"bmc":` + bmc + `,"action":"on"} {}`,
			`{"bmc":` + bmc + `}`,
			`{"bmc":{"address":"127.0.0.1","spki_pin":"sha256/nope"},"action":"on"}`,
			`{"bmc":{"address":"127.0.0.1","spki_pin":"` + e.srv.Pin() + `","system_id":"../x"},"action":"on"}`,
		},
		KindBootDevice:        {`{"bmc":` + bmc + `,"device":"usb"}`, `{"bmc":` + bmc + `,"device":"pxe","once":"yes"}`},
		KindInspect:           {`{"bmc":` + bmc + `,"deep":true}`, `[]`},
		KindVirtualMedia:      {`{"bmc":` + bmc + `,"action":"insert"}`, `{"bmc":` + bmc + `,"action":"eject","image_url":"https://x/y"}`, `{"bmc":` + bmc + `,"action":"insert","image_url":"https://u:p@x/y.iso"}`},
		KindFirmwareInventory: {`{"bmc":` + bmc + `,"update":true}`},
		KindRotateCredentials: {`{"bmc":` + bmc + `,"new_password":"x"}`},
	} {
		for _, b := range bodies {
			if _, err := e.run(t, kind, b); err == nil || !strings.HasPrefix(err.Error(), "body") {
				t.Errorf("%s %s: %v; want a body error", kind, b, err)
			}
		}
	}
	if n := len(e.srv.Requests()); n != 0 || len(e.secrets.calls) != 0 {
		t.Fatalf("refused bodies reached the BMC (%d requests) or the gateway (%v)", n, e.secrets.calls)
	}
	if _, err := e.run(t, KindPower, `{"bmc":{"address":"127.0.0.1","spki_pin":"`+e.srv.Pin()+`","driver":"ipmi"},"action":"on"}`); err == nil ||
		!strings.HasPrefix(err.Error(), "unsupported-driver") {
		t.Fatalf("ipmi driver: %v", err)
	}
}

func TestResources(t *testing.T) {
	for in, want := range map[string]string{
		`{"bmc":{"address":"10.1.0.5"}}`:        "bmc:10.1.0.5:443",
		`{"bmc":{"address":"10.1.0.5:443"}}`:    "bmc:10.1.0.5:443",
		`{"bmc":{"address":"[fd00::5]:8443"}}`:  "bmc:[fd00::5]:8443",
		`{"bmc":{"address":"FD00:0::5"},"x":1}`: "bmc:[fd00::5]:443",
	} {
		got, err := bmcResource([]byte(in))
		if err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("%s: %v %v; want %s", in, got, err, want)
		}
	}
	if _, err := bmcResource([]byte(`{"bmc":{}}`)); err == nil {
		t.Fatal("no address, a resource")
	}
}

func TestParseCredentials(t *testing.T) {
	c, err := parseCredentials([]byte(`{"password":"p\u00e9\"\\w\ud83d\ude00","username":"r\/oot"}`))
	if err != nil || string(c.username) != "r/oot" || string(c.password) != "p\u00e9\"\\w\U0001F600" {
		t.Fatalf("%q %q %v", c.username, c.password, err)
	}
}
