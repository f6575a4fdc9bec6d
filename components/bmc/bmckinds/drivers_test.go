package bmckinds

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/bcx"
	"github.com/better-compute/bcd/components/bcx/ipmisim"
)

// TestMain lets this test binary be bcd's plugin shim (__bcx-exec), as the
// site binary is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == bcx.ShimName {
		os.Exit(bcx.Shim(os.Args[2:], os.Stderr))
	}
	os.Exit(m.Run())
}

const ipmiPassword = "ipmi-Kinds-pw7"

// hostIPMI builds cmd/bcx-ipmi, pins it and hosts it with a real bcx.Host.
func hostIPMI(t *testing.T) *bcx.Host {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "bcx-ipmi")
	cmd := exec.Command("go", "build", "-o", out, "../../../cmd/bcx-ipmi")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build bcx-ipmi: %v\n%s", err, b)
	}
	b, _ := os.ReadFile(out)
	if err := os.WriteFile(filepath.Join(dir, bcx.PinsFile), []byte(sha256hex(b)+"  bcx-ipmi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := bcx.New(bcx.Config{Dir: dir, Log: slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	h.WaitStarted(30 * time.Second)
	if h.PID("ipmi") == 0 {
		t.Fatal("bcx-ipmi did not start")
	}
	return h
}

// TestBCXDriver: bmc.* kinds with driver "ipmi" go through the plugin host
// to bcx-ipmi and ipmitool, against ipmi_sim.
func TestBCXDriver(t *testing.T) {
	sim := ipmisim.Start(t, ipmisim.Options{Password: ipmiPassword})
	h := hostIPMI(t)
	nets, _ := ParseNetworks([]string{"127.0.0.0/8"})
	f := &fakeSecrets{values: map[string][]byte{CredentialsSecret: credsJSON(sim.Username, ipmiPassword)}}
	e := &env{cfg: Config{Networks: nets, Drivers: h}, secrets: f, ctx: session.WithSecrets(context.Background(), f)}
	bmc := `{"address":"` + sim.Addr + `","driver":"ipmi","options":{"cipher_suite":3}}`
	run := func(kind, body string) (json.RawMessage, error) {
		t.Helper()
		out, err := e.run(t, kind, body)
		if strings.Contains(string(out), ipmiPassword) || err != nil && strings.Contains(err.Error(), ipmiPassword) {
			t.Fatalf("the password leaked: %s %v", out, err)
		}
		return out, err
	}
	out, err := run(KindPower, `{"bmc":`+bmc+`,"action":"on"}`)
	if p := decodeInto[PowerResult](t, out); err != nil || p.PowerState != "On" || p.Action != "on" {
		t.Fatalf("power on: %s %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(sim.Dir, "on")); err != nil {
		t.Fatal("ipmi_sim's chassis was not powered on")
	}
	out, err = run(KindBootDevice, `{"bmc":`+bmc+`,"device":"pxe","once":true}`)
	if b := decodeInto[BootResult](t, out); err != nil || b.Target != "Pxe" || sim.Boot() != "pxe" {
		t.Fatalf("boot device: %s %v (the BMC holds %q)", out, err, sim.Boot())
	}
	out, err = run(KindInspect, `{"bmc":`+bmc+`}`)
	if err != nil || !strings.Contains(string(out), ipmisim.UUID) || !strings.Contains(string(out), ipmisim.Serial) {
		t.Fatalf("inspect: %s %v", out, err)
	}
	out, err = run(KindPower, `{"bmc":`+bmc+`,"action":"off"}`)
	if p := decodeInto[PowerResult](t, out); err != nil || p.PowerState != "Off" {
		t.Fatalf("power off: %s %v", out, err)
	}
	// What IPMI cannot do answers unsupported-operation, after the
	// credentials were fetched and zeroed.
	if _, err := run(KindFirmwareInventory, `{"bmc":`+bmc+`}`); err == nil || !strings.Contains(err.Error(), bcx.CodeUnsupportedOperation) {
		t.Fatalf("firmware inventory over IPMI: %v", err)
	}
	// A BMC enrolled with a TLS pin: bcx-ipmi refuses it.
	pinned := `{"address":"` + sim.Addr + `","driver":"ipmi","spki_pin":"sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="}`
	if _, err := run(KindPower, `{"bmc":`+pinned+`,"action":"status"}`); err == nil || !strings.Contains(err.Error(), "IPMI has no TLS") {
		t.Fatalf("a TLS-pinned BMC over IPMI: %v", err)
	}
	f.calls = nil
	// Outside bmc_networks, or a driver the agent does not host: refused
	// before any secret is asked for.
	for body, want := range map[string]string{
		`{"bmc":{"address":"10.9.9.9:623","driver":"ipmi"},"action":"on"}`:                    "outside [site] bmc_networks",
		`{"bmc":{"address":"127.0.0.1:623","driver":"vendorx"},"action":"on"}`:                "unsupported-driver",
		`{"bmc":{"address":"bmc.example:623","driver":"ipmi"},"action":"on"}`:                 "IP address",
		`{"bmc":{"address":"127.0.0.1:623","driver":"ipmi","legacy_tls":true},"action":"on"}`: "legacy_tls",
	} {
		if _, err := run(KindPower, body); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
	if len(f.calls) != 0 {
		t.Fatalf("refused commands asked the gateway for %v", f.calls)
	}
	// A Redfish BMC may not carry driver options.
	if _, err := run(KindPower, `{"bmc":{"address":"127.0.0.1","spki_pin":"sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=","options":{"x":1}},"action":"on"}`); err == nil || !strings.Contains(err.Error(), "bmc.options") {
		t.Fatalf("redfish with options: %v", err)
	}
}

// TestDriverUnavailableIsRetryable: while the plugin is down, a bmc.*
// command fails with the host's retryable unavailable.
func TestDriverUnavailableIsRetryable(t *testing.T) {
	sim := ipmisim.Start(t, ipmisim.Options{Password: ipmiPassword})
	h := hostIPMI(t)
	nets, _ := ParseNetworks([]string{"127.0.0.0/8"})
	f := &fakeSecrets{values: map[string][]byte{CredentialsSecret: credsJSON(sim.Username, ipmiPassword)}}
	e := &env{cfg: Config{Networks: nets, Drivers: h}, secrets: f, ctx: session.WithSecrets(context.Background(), f)}
	if err := syscallKill(h.PID("ipmi")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for h.PID("ipmi") != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	_, err := e.run(t, KindPower, `{"bmc":{"address":"`+sim.Addr+`","driver":"ipmi","options":{"cipher_suite":3}},"action":"status"}`)
	if err == nil || !strings.Contains(err.Error(), "unavailable (retryable)") {
		t.Fatalf("with the plugin down: %v", err)
	}
}
