package redfish_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/bmc/redfish"
	"github.com/better-compute/bcd/components/bmc/redfish/redfishtest"
	"github.com/better-compute/bcd/components/trust/pki"
)

func client(t *testing.T, s *redfishtest.Server) *redfish.Client {
	t.Helper()
	c := &redfish.Client{Addr: s.Addr(), SPKIPin: s.Pin(), Username: []byte(s.Username()),
		Password: []byte(redfishtest.DefaultPassword), Timeout: 10 * time.Second}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func otherPin(t *testing.T) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pki.Pin(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSessionLifecycle(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{})
	c := client(t, s)
	ctx := context.Background()
	st, err := c.Power(ctx)
	if err != nil || st != "On" {
		t.Fatalf("Power = %q, %v; want On", st, err)
	}
	if c.Authenticated() != "session" || s.LiveSessions() != 1 {
		t.Fatalf("auth %q with %d live sessions; want one session", c.Authenticated(), s.LiveSessions())
	}
	for _, r := range s.Requests() {
		if r.Auth == "basic" {
			t.Errorf("%s %s used basic auth while a session was open", r.Method, r.Path)
		}
	}
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if s.LiveSessions() != 0 {
		t.Fatalf("%d sessions left after Close", s.LiveSessions())
	}
	last := s.Requests()[len(s.Requests())-1]
	if last.Method != http.MethodDelete || !strings.HasPrefix(last.Path, redfishtest.Sessions+"/") {
		t.Fatalf("last request %v; want the session's DELETE", last)
	}
}

func TestBasicFallback(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{NoSessions: true})
	c := client(t, s)
	if _, err := c.Power(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c.Authenticated() != "basic" {
		t.Fatalf("auth %q; want basic", c.Authenticated())
	}
}

func TestWrongCredentials(t *testing.T) {
	for _, noSessions := range []bool{false, true} {
		s := redfishtest.Start(t, redfishtest.Options{NoSessions: noSessions, Misbehave: redfishtest.EchoCredentials})
		c := client(t, s)
		c.Password = []byte("wrong-Pa55word")
		_, err := c.Power(context.Background())
		if redfish.StatusOf(err) != http.StatusUnauthorized {
			t.Fatalf("sessions=%v: err %v; want 401", !noSessions, err)
		}
		if strings.Contains(err.Error(), "wrong-Pa55word") {
			t.Fatalf("the password is in the error: %v", err)
		}
		if !strings.Contains(err.Error(), "NoValidSession") {
			t.Errorf("the refusal's MessageId was not kept: %v", err)
		}
		// Refused session credentials must not be retried as basic auth.
		for _, r := range s.Requests() {
			if !noSessions && r.Auth == "bad" && r.Method != http.MethodPost {
				t.Errorf("retried refused credentials: %v", r)
			}
		}
	}
}

func TestPinMismatch(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{})
	c := client(t, s)
	c.SPKIPin = otherPin(t)
	if err := c.Verify(context.Background()); !errors.Is(err, redfish.ErrPinMismatch) {
		t.Fatalf("Verify: %v; want ErrPinMismatch", err)
	}
	if _, err := c.Power(context.Background()); !errors.Is(err, redfish.ErrPinMismatch) {
		t.Fatalf("Power: %v; want ErrPinMismatch", err)
	}
	if n := len(s.Requests()); n != 0 {
		t.Fatalf("the server saw %d requests from a client that does not trust it", n)
	}
	c2 := &redfish.Client{Addr: s.Addr(), SPKIPin: "sha256/short"}
	if err := c2.Verify(context.Background()); err == nil {
		t.Fatal("a malformed pin was accepted")
	}
}

func TestSystemID(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{})
	c := client(t, s)
	c.SystemID = redfishtest.SystemID
	inv, err := c.Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if inv.System.ID != redfishtest.SystemID {
		t.Fatalf("system %q", inv.System.ID)
	}
	for _, r := range s.Requests() {
		if r.Path == redfishtest.Root+"/Systems" {
			t.Errorf("read the Systems collection although the system id was given")
		}
	}
	c2 := client(t, s)
	c2.SystemID = "nope"
	if _, err := c2.Power(context.Background()); redfish.StatusOf(err) != http.StatusNotFound {
		t.Fatalf("unknown system: %v; want 404", err)
	}
	c3 := client(t, s)
	c3.SystemID = "../Managers/BMC"
	if _, err := c3.Power(context.Background()); err == nil {
		t.Fatal("a system id with a path was accepted")
	}
}

func TestPower(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{})
	c := client(t, s)
	ctx := context.Background()
	steps := []struct{ action, wantReset, wantState string }{
		{redfish.PowerOn, "", "On"},               // already on: nothing sent
		{redfish.PowerCycle, "ForceOff,On", "On"}, // no PowerCycle allowed: off, then on
		{redfish.PowerOff, "ForceOff", "Off"},
		{redfish.PowerOff, "", "Off"},
		{redfish.PowerCycle, "On", "On"}, // cycling an off system turns it on
	}
	for _, st := range steps {
		rt, err := c.SetPower(ctx, st.action)
		if err != nil || rt != st.wantReset {
			t.Fatalf("SetPower(%s) = %q, %v; want %q", st.action, rt, err, st.wantReset)
		}
		if got := s.PowerState(); got != st.wantState {
			t.Fatalf("after %s the server is %s; want %s", st.action, got, st.wantState)
		}
	}
	if got := s.Resets(); !slices.Equal(got, []string{"ForceOff", "On", "ForceOff", "On"}) {
		t.Fatalf("resets %v", got)
	}
	if _, err := c.SetPower(ctx, "reboot"); err == nil {
		t.Fatal("an unknown power action was accepted")
	}
}

func TestPowerCycleAdvertised(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{ResetTypes: []string{"On", "ForceOff", "PowerCycle"}})
	c := client(t, s)
	if rt, err := c.SetPower(context.Background(), redfish.PowerCycle); err != nil || rt != "PowerCycle" {
		t.Fatalf("SetPower(cycle) = %q, %v", rt, err)
	}
	s2 := redfishtest.Start(t, redfishtest.Options{ResetTypes: []string{"Nmi"}})
	if _, err := client(t, s2).SetPower(context.Background(), redfish.PowerOff); err == nil || !strings.Contains(err.Error(), "allows none") {
		t.Fatalf("no usable reset type: %v", err)
	}
}

func TestBootDevice(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{RequireIfMatch: true})
	c := client(t, s)
	ctx := context.Background()
	for _, tc := range []struct {
		dev          string
		once         bool
		target, mode string
	}{{redfish.BootDisk, false, "Hdd", "Continuous"}, {redfish.BootPXE, true, "Pxe", "Once"}, {redfish.BootCD, true, "Cd", "Once"}} {
		if err := c.SetBootDevice(ctx, tc.dev, tc.once); err != nil {
			t.Fatalf("SetBootDevice(%s): %v", tc.dev, err)
		}
		if tgt, en := s.Boot(); tgt != tc.target || en != tc.mode {
			t.Fatalf("server boot %s/%s; want %s/%s", tgt, en, tc.target, tc.mode)
		}
	}
	if err := c.SetBootDevice(ctx, "floppy", true); err == nil {
		t.Fatal("an unknown boot device was accepted")
	}
}

func TestInspect(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{})
	inv, err := client(t, s).Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sys := inv.System
	if sys.Manufacturer != "Contoso" || sys.Model != "3500" || sys.SerialNumber != "437XR1138R2" ||
		sys.UUID != "38947555-7742-3448-3784-823347823834" || sys.BIOSVersion != "P79 v1.45 (12/06/2017)" {
		t.Fatalf("system %+v", sys)
	}
	if len(inv.Processors) != 2 || inv.Processors[0].Cores != 8 { // CPU2 is absent
		t.Fatalf("processors %+v", inv.Processors)
	}
	if len(inv.Memory) != 3 { // DIMM4 is absent
		t.Fatalf("memory %+v", inv.Memory)
	}
	var macs []string
	for _, n := range inv.NICs {
		macs = append(macs, n.PermanentMAC)
	}
	for _, want := range []string{"12:44:6a:3b:04:11", "12:44:6a:3b:88:90"} {
		if !slices.Contains(macs, want) {
			t.Errorf("NIC MACs %v lack %s", macs, want)
		}
	}
	if len(inv.Storage) != 2 || inv.Storage[0].CapacityBytes != 8000000000000 {
		t.Fatalf("storage %+v", inv.Storage)
	}
}

func TestInspectStorage(t *testing.T) {
	sys := redfishtest.System
	s := redfishtest.Start(t, redfishtest.Options{Extra: map[string]string{
		sys + "/Storage": `{"@odata.id":"` + sys + `/Storage","Members":[{"@odata.id":"` + sys + `/Storage/RAID1"}]}`,
		sys + "/Storage/RAID1": `{"@odata.id":"` + sys + `/Storage/RAID1","Id":"RAID1","Drives":[` +
			`{"@odata.id":"` + sys + `/Storage/RAID1/Drives/0"},{"@odata.id":"/elsewhere/Drives/1"}]}`,
		sys + "/Storage/RAID1/Drives/0": `{"Id":"0","Model":"NVMe X","SerialNumber":"S1","CapacityBytes":"1000","MediaType":"SSD","Protocol":"NVMe"}`,
	}})
	_, err := client(t, s).Inspect(context.Background())
	if !errors.Is(err, redfish.ErrOutsideRoot) {
		t.Fatalf("a drive outside /redfish/v1: %v; want ErrOutsideRoot", err)
	}
	s2 := redfishtest.Start(t, redfishtest.Options{Extra: map[string]string{
		sys + "/Storage":                `{"Members":[{"@odata.id":"` + sys + `/Storage/RAID1"}]}`,
		sys + "/Storage/RAID1":          `{"Id":"RAID1","Drives":[{"@odata.id":"` + sys + `/Storage/RAID1/Drives/0"}]}`,
		sys + "/Storage/RAID1/Drives/0": `{"Id":"0","Model":"NVMe X","SerialNumber":"S1","CapacityBytes":"1000","MediaType":"SSD","Protocol":"NVMe"}`,
	}})
	inv, err := client(t, s2).Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := redfish.Drive{ID: "0", Controller: "RAID1", Model: "NVMe X", SerialNumber: "S1", CapacityBytes: 1000, MediaType: "SSD", Protocol: "NVMe"}
	if len(inv.Storage) != 1 || inv.Storage[0] != want {
		t.Fatalf("storage %+v", inv.Storage)
	}
}

func TestVirtualMedia(t *testing.T) {
	for _, opts := range []redfishtest.Options{{}, {VirtualMediaOnManager: true}, {HideMediaActions: true}} {
		s := redfishtest.Start(t, opts)
		c := client(t, s)
		ctx := context.Background()
		const img = "https://images.example/install.iso"
		if err := c.InsertMedia(ctx, img); err != nil { // the mockup's CD holds an image: ejected first
			t.Fatalf("%+v: InsertMedia: %v", opts, err)
		}
		if got, in := s.Media(); got != img || !in {
			t.Fatalf("%+v: media %q inserted=%v", opts, got, in)
		}
		if err := c.EjectMedia(ctx); err != nil {
			t.Fatalf("EjectMedia: %v", err)
		}
		if _, in := s.Media(); in {
			t.Fatal("still inserted after EjectMedia")
		}
		if err := c.EjectMedia(ctx); err != nil {
			t.Fatalf("EjectMedia of an empty CD: %v", err)
		}
		for _, bad := range []string{"ftp://x/y.iso", "https://user:pw@x/y.iso", "https://x/a b.iso", "/local.iso"} {
			if err := c.InsertMedia(ctx, bad); err == nil {
				t.Errorf("image url %q accepted", bad)
			}
		}
	}
}

func TestFirmwareInventory(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{})
	fw, err := client(t, s).FirmwareInventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(fw) != 3 || fw[0].ID != "BMC" || fw[0].Version != "1.45.455b66-rev4" || !fw[0].Updateable {
		t.Fatalf("firmware %+v", fw)
	}
}

func TestRotatePassword(t *testing.T) {
	for _, noSessions := range []bool{false, true} {
		s := redfishtest.Start(t, redfishtest.Options{NoSessions: noSessions, RequireIfMatch: true})
		c := client(t, s)
		ctx := context.Background()
		err := c.RotatePassword(ctx, []byte("short"))
		if err == nil || strings.Contains(err.Error(), "short") {
			t.Fatalf("short password: %v", err)
		}
		newPW := []byte(`n3w-"pass\word`)
		if err := c.RotatePassword(ctx, newPW); err != nil {
			t.Fatalf("RotatePassword: %v", err)
		}
		if s.Password() != string(newPW) {
			t.Fatalf("server password %q", s.Password())
		}
		if _, err := c.Power(ctx); err != nil { // basic auth now uses the new password
			t.Fatalf("after rotation: %v", err)
		}
		old := client(t, s)
		if _, err := old.Power(ctx); redfish.StatusOf(err) != http.StatusUnauthorized {
			t.Fatalf("old password: %v; want 401", err)
		}
		fresh := client(t, s)
		fresh.Password = newPW
		if _, err := fresh.Power(ctx); err != nil {
			t.Fatalf("new password: %v", err)
		}
	}
}

func TestRotatePasswordRedactsEcho(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{Misbehave: redfishtest.EchoCredentials})
	c := client(t, s)
	newPW := []byte("Echo<Me>&1")
	err := c.RotatePassword(context.Background(), newPW)
	if err == nil || redfish.StatusOf(err) != http.StatusBadRequest {
		t.Fatalf("err %v; want the BMC's 400", err)
	}
	if strings.Contains(err.Error(), "Echo") || !strings.Contains(err.Error(), "[redacted]") {
		t.Fatalf("the new password is not redacted: %v", err)
	}
}

func TestBIOS(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{RequireIfMatch: true})
	c := client(t, s)
	ctx := context.Background()
	b, err := c.BIOS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Attributes["ProcTurboMode"] != "Enabled" || b.Pending["ProcTurboMode"] != "Disabled" || b.Registry == "" {
		t.Fatalf("bios %+v", b)
	}
	if _, ok := b.Pending["BootMode"]; ok {
		t.Fatalf("pending lists an unchanged attribute: %+v", b.Pending)
	}
	if err := c.SetBIOS(ctx, map[string]any{"ProcHyperthreading": "Disabled"}); err != nil {
		t.Fatalf("SetBIOS: %v", err)
	}
	if _, pend := s.BIOS(); pend["ProcHyperthreading"] != "Disabled" {
		t.Fatalf("server pending %v", pend)
	}
	if err := c.SetBIOS(ctx, map[string]any{"NoSuchAttribute": 1}); err == nil {
		t.Fatal("an unknown attribute was accepted")
	}
	if err := c.SetBIOS(ctx, map[string]any{"ProcHyperthreading": map[string]any{}}); err == nil {
		t.Fatal("an object value was accepted")
	}
	if _, err := c.SetPower(ctx, redfish.PowerCycle); err != nil {
		t.Fatal(err)
	}
	if cur, _ := s.BIOS(); cur["ProcHyperthreading"] != "Disabled" {
		t.Fatalf("after a cycle the BIOS is %v", cur)
	}
}

func TestMisbehavingBMC(t *testing.T) {
	other := redfishtest.Start(t, redfishtest.Options{})
	for _, tc := range []struct {
		name string
		m    redfishtest.Misbehavior
		want error
	}{
		{"link outside /redfish/v1", redfishtest.LinkOutsideRoot, redfish.ErrOutsideRoot},
		{"link to another host", redfishtest.LinkOtherHost, redfish.ErrOutsideRoot},
		{"redirect to another host", redfishtest.RedirectOtherHost, redfish.ErrOutsideRoot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redfishtest.Start(t, redfishtest.Options{Misbehave: tc.m, RedirectTo: other.URL()})
			_, err := client(t, s).Power(context.Background())
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v; want %v", err, tc.want)
			}
			for _, r := range s.Requests() {
				if !strings.HasPrefix(r.Path, redfishtest.Root) {
					t.Errorf("requested %s", r.Path)
				}
			}
			if n := len(other.Requests()); n != 0 {
				t.Fatalf("the other host saw %d requests", n)
			}
		})
	}
	t.Run("link outside via a system's collection", func(t *testing.T) {
		s := redfishtest.Start(t, redfishtest.Options{Misbehave: redfishtest.LinkOutsideRoot})
		c := client(t, s)
		c.SystemID = redfishtest.SystemID
		if _, err := c.Inspect(context.Background()); !errors.Is(err, redfish.ErrOutsideRoot) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("huge body", func(t *testing.T) {
		s := redfishtest.Start(t, redfishtest.Options{Misbehave: redfishtest.HugeBody})
		_, err := client(t, s).Power(context.Background())
		if err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("err %v", err)
		}
	})
}

func TestNormalizeAddr(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.5": "10.0.0.5:443", "10.0.0.5:8443": "10.0.0.5:8443", "fe80::1": "[fe80::1]:443",
		"[fe80::1]:8443": "[fe80::1]:8443", "BMC.example": "bmc.example:443", "[::ffff:10.0.0.1]": "10.0.0.1:443",
	} {
		got, _, err := redfish.NormalizeAddr(in)
		if err != nil || got != want {
			t.Errorf("NormalizeAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "https://10.0.0.5", "10.0.0.5/x", "u@10.0.0.5", "10.0.0.5:0", "10.0.0.5:99999",
		"fe80::1%eth0", "10.0.0.5:", ":443", "a b", "10.0.0.5:+443"} {
		if got, _, err := redfish.NormalizeAddr(bad); err == nil {
			t.Errorf("NormalizeAddr(%q) = %q; want an error", bad, got)
		}
	}
}
