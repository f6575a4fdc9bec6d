package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/bcx"
	"github.com/better-compute/bcd/components/bcx/ipmisim"
)

// recorder is an ipmitool that writes its argv, environment and the
// password file's descriptor kind to a log, then runs the real ipmitool
// with the same fd 3.
func recorder(t *testing.T) (path, log string) {
	t.Helper()
	dir := t.TempDir()
	log = filepath.Join(dir, "calls.log")
	path = filepath.Join(dir, "ipmitool")
	script := `#!/bin/sh
{ echo "ARGV: $*"; echo "ENV: $(env | tr '\n' ' ')"; echo "FD3: $(readlink /proc/self/fd/3)"; } >> ` + log + `
exec ipmitool "$@"
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, log
}

func req(b *ipmisim.BMC, cs int, body string) bcx.Request {
	c, _ := json.Marshal(map[string]any{"address": b.Addr, "options": map[string]any{"cipher_suite": cs}})
	return bcx.Request{Config: c, Body: json.RawMessage(body),
		Secrets: map[string][]byte{"username": []byte(b.Username), "password": []byte(b.Password)}}
}

func invoke[T any](t *testing.T, d *driver, op string, r bcx.Request) T {
	t.Helper()
	out, err := d.Invoke(context.Background(), op, r)
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	var v T
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("%s: %v: %s", op, err, out)
	}
	return v
}

// TestAgainstIPMISim drives ipmi_sim (OpenIPMI) on loopback with the real
// ipmitool: power on, status, boot device, inspection, power off, each
// seen in the simulator's own state, and the password never on a command
// line or in an environment.
func TestAgainstIPMISim(t *testing.T) {
	b := ipmisim.Start(t, ipmisim.Options{})
	tool, log := recorder(t)
	d := &driver{ipmitool: tool}

	if p := invoke[PowerState](t, d, opGetPower, req(b, 3, `{}`)); p.PowerState != "Off" {
		t.Fatalf("power %+v", p)
	}
	invoke[SetPower](t, d, opSetPower, req(b, 3, `{"state":"on"}`))
	if _, err := os.Stat(filepath.Join(b.Dir, "on")); err != nil {
		t.Fatal("the BMC's chassis control did not power the machine on")
	}
	if p := invoke[PowerState](t, d, opGetPower, req(b, 3, ``)); p.PowerState != "On" {
		t.Fatalf("power %+v", p)
	}
	br := invoke[BootResult](t, d, opSetBootDevice, req(b, 3, `{"device":"pxe","once":true}`))
	if br.Target != "Pxe" || br.Enabled != "Once" || b.Boot() != "pxe" {
		t.Fatalf("boot %+v, the BMC holds %q", br, b.Boot())
	}
	br = invoke[BootResult](t, d, opSetBootDevice, req(b, 3, `{"device":"disk"}`))
	if br.Target != "Hdd" || b.Boot() != "default" {
		t.Fatalf("boot %+v, the BMC holds %q", br, b.Boot())
	}
	inv := invoke[Inventory](t, d, opInspect, req(b, 3, `{}`))
	if inv.System != (System{Manufacturer: ipmisim.Manufacturer, Model: ipmisim.Model, Serial: ipmisim.Serial, UUID: ipmisim.UUID}) {
		t.Errorf("system %+v", inv.System)
	}
	if inv.BMC["ipmi_version"] != "2.0" || inv.BMC["manufacturer_id"] == "" {
		t.Errorf("bmc %v", inv.BMC)
	}
	if len(inv.Sensors) != 1 || inv.Sensors[0].Name != ipmisim.SensorName || !strings.Contains(inv.Sensors[0].Reading, "degrees C") {
		t.Errorf("sensors %+v", inv.Sensors)
	}
	if len(inv.Errors) != 0 {
		t.Errorf("errors %v", inv.Errors)
	}
	invoke[SetPower](t, d, opSetPower, req(b, 3, `{"state":"off"}`))
	if _, err := os.Stat(filepath.Join(b.Dir, "on")); err == nil {
		t.Fatal("still on after power off")
	}
	if p := invoke[PowerState](t, d, opGetPower, req(b, 3, `{}`)); p.PowerState != "Off" {
		t.Fatalf("power %+v", p)
	}
	calls, _ := os.ReadFile(log)
	n := strings.Count(string(calls), "ARGV:")
	if n < 10 || strings.Contains(string(calls), b.Password) {
		t.Fatalf("%d ipmitool calls; the password must be in none of their argv or environments:\n%s", n, calls)
	}
	if !strings.Contains(string(calls), "-f /dev/fd/3") || !strings.Contains(string(calls), "FD3: pipe:") || !strings.Contains(string(calls), "-C 3 ") {
		t.Fatalf("the password does not come over a pipe on fd 3, or the cipher suite option was not used:\n%s", calls)
	}
	t.Logf("%d ipmitool runs against ipmi_sim; none had the password in argv or env", n)
}

// TestDefaultCipherSuite17: without options the driver asks for cipher
// suite 17, which this ipmi_sim does not offer, so the call fails (without
// the password in the error).
func TestDefaultCipherSuite17(t *testing.T) {
	b := ipmisim.Start(t, ipmisim.Options{})
	tool, log := recorder(t)
	d := &driver{ipmitool: tool}
	r := req(b, 0, `{}`)
	r.Config, _ = json.Marshal(map[string]any{"address": b.Addr})
	_, err := d.Invoke(context.Background(), opGetPower, r)
	calls, _ := os.ReadFile(log)
	if err == nil || !strings.Contains(string(calls), "-C 17 ") {
		t.Fatalf("err %v; calls:\n%s", err, calls)
	}
	if strings.Contains(err.Error(), b.Password) {
		t.Fatal("the password is in the error")
	}
	// A wrong password is refused by the BMC; the error does not carry it.
	r = req(b, 3, `{}`)
	r.Secrets["password"] = []byte("wrong-Password-9")
	_, err = d.Invoke(context.Background(), opGetPower, r)
	if err == nil || strings.Contains(err.Error(), "wrong-Password-9") {
		t.Fatalf("wrong password: %v", err)
	}
	t.Logf("wrong password: %v", err)
}

func TestRefusals(t *testing.T) {
	d := &driver{ipmitool: "/nonexistent/ipmitool"} // nothing may run
	good := map[string][]byte{"username": []byte("admin"), "password": []byte("pw-123")}
	for _, c := range []struct {
		name, op, config, body string
		secrets                map[string][]byte
		want                   string
	}{
		{"TLS pin", opGetPower, `{"address":"10.0.0.5","tls_pin":"sha256/AAAA"}`, `{}`, good, "IPMI has no TLS"},
		{"cipher suite 1", opGetPower, `{"address":"10.0.0.5","options":{"cipher_suite":1}}`, `{}`, good, "3, 8, 12 or 17"},
		{"unknown option", opGetPower, `{"address":"10.0.0.5","options":{"kg":"x"}}`, `{}`, good, "unknown field"},
		{"DNS name", opGetPower, `{"address":"bmc.example.com"}`, `{}`, good, "IP address"},
		{"bad port", opGetPower, `{"address":"10.0.0.5:99999"}`, `{}`, good, "port"},
		{"no secrets", opGetPower, `{"address":"10.0.0.5"}`, `{}`, nil, "required"},
		{"long password", opGetPower, `{"address":"10.0.0.5"}`, `{}`, map[string][]byte{"username": []byte("a"), "password": []byte(strings.Repeat("p", 21))}, "1 to 20 bytes"},
		{"newline in password", opGetPower, `{"address":"10.0.0.5"}`, `{}`, map[string][]byte{"username": []byte("a"), "password": []byte("pw\nx")}, "line breaks"},
		{"bad state", opSetPower, `{"address":"10.0.0.5"}`, `{"state":"explode"}`, good, "state"},
		{"bad device", opSetBootDevice, `{"address":"10.0.0.5"}`, `{"device":"usb"}`, good, "device"},
		{"unknown body field", opGetPower, `{"address":"10.0.0.5"}`, `{"x":1}`, good, "unknown field"},
		{"unknown op", "media.insert", `{"address":"10.0.0.5"}`, `{}`, good, "does not implement"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := d.Invoke(context.Background(), c.op, bcx.Request{Config: json.RawMessage(c.config), Body: json.RawMessage(c.body), Secrets: c.secrets})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			if strings.Contains(err.Error(), "pw-123") || strings.Contains(err.Error(), "ppppp") {
				t.Fatal("a secret is in the error")
			}
		})
	}
}

func TestParsers(t *testing.T) {
	for _, c := range []struct{ out, target, enabled string }{
		{" Boot Flags :\n   - Boot Flag Invalid\n   - Options apply to only next boot\n   - Boot Device Selector : Force PXE\n", "Pxe", "Once"},
		{"   - Options apply to all future boots\n   - Boot Device Selector : Force Boot from CD/DVD\n", "Cd", "Continuous"},
		{"   - Options apply to all future boots\n   - Boot Device Selector : Force Boot from Mars\n", "Other", "Continuous"},
	} {
		tg, en, err := parseBootFlags(c.out)
		if err != nil || tg != c.target || en != c.enabled {
			t.Errorf("%q: %s %s %v", c.out, tg, en, err)
		}
	}
	if _, _, err := parseBootFlags("nothing"); err == nil {
		t.Error("parsed nothing")
	}
	if s, err := parsePower("Chassis Power is on\n"); s != "On" || err != nil {
		t.Error(s, err)
	}
	if _, err := parsePower("Chassis Power is maybe"); err == nil {
		t.Error("parsed maybe")
	}
	if u, ok := parseUUID("EFCDAB89-6745-23A1-EFCD-AB89674523A1"); !ok || u != "efcdab89-6745-23a1-efcd-ab89674523a1" {
		t.Error(u)
	}
	ss := parseSDR("Temp | 01h | ok | 3.1 | 96 degrees C\nbad line\n | x | y | z | w\n")
	if fmt.Sprint(ss) != "[{Temp 01h ok 3.1 96 degrees C}]" {
		t.Error(ss)
	}
}
