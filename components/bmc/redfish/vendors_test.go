package redfish_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/bmc/redfish"
	"github.com/better-compute/bcd/components/bmc/redfish/redfishtest"
)

// Tests of Redfish as vendors implement it, against the DMTF mockups as
// edited in testdata/ (see testdata/README.md for what each edit imitates).

// overlay reads testdata/<name> (a tree of <path under /redfish/v1>/index.json)
// into redfishtest Extra resources, plus the removals given (paths that
// must answer 404).
func overlay(t *testing.T, name string, remove ...string) map[string]string {
	t.Helper()
	dir := filepath.Join("testdata", name)
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "index.json" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, filepath.Dir(p))
		out[redfishtest.Root+"/"+filepath.ToSlash(rel)] = string(b)
		return nil
	})
	if err != nil || len(out) == 0 {
		t.Fatalf("testdata %s: %v (%d resources)", name, err, len(out))
	}
	for _, p := range remove {
		out[p] = ""
	}
	return out
}

func posts(s *redfishtest.Server) []string {
	var out []string
	for _, r := range s.Requests() {
		if (r.Method == http.MethodPost || r.Method == http.MethodPatch) && r.Path != redfishtest.Sessions {
			out = append(out, r.Method+" "+r.Path)
		}
	}
	return out
}

const (
	mediaColl = redfishtest.System + "/VirtualMedia"
	img       = "https://images.example/install.iso?v=2"
)

// TestMediaSlotFallThrough: Floppy1 (USBStick/Floppy) is never used; CD1
// advertises InsertMedia but answers 405 or 404 for it (as a slot the
// firmware retired does), so the insert falls through to CD2, which lists
// no MediaTypes but advertises InsertMedia.
func TestMediaSlotFallThrough(t *testing.T) {
	for _, status := range []int{http.StatusMethodNotAllowed, http.StatusNotFound} {
		s := redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "media-slots"),
			Fail: map[string]int{"POST " + mediaColl + "/CD1/Actions/VirtualMedia.InsertMedia": status}})
		c := client(t, s)
		ctx := context.Background()
		if err := c.InsertMedia(ctx, img); err != nil {
			t.Fatalf("%d: InsertMedia: %v", status, err)
		}
		if got, in := s.MediaAt(mediaColl + "/CD2"); got != img || !in {
			t.Fatalf("%d: CD2 holds %q inserted=%v; want the image", status, got, in)
		}
		if _, in := s.MediaAt(mediaColl + "/CD1"); in {
			t.Fatalf("%d: CD1 took the image although it answered %d", status, status)
		}
		want := []string{
			"POST " + mediaColl + "/CD1/Actions/VirtualMedia.InsertMedia",
			"POST " + mediaColl + "/CD2/Actions/VirtualMedia.InsertMedia",
		}
		if got := posts(s); !slices.Equal(got, want) {
			t.Fatalf("%d: requests %v; want %v (no PATCH, nothing to Floppy1)", status, got, want)
		}
		m, err := c.CDMedia(ctx)
		if err != nil || m.ID != "CD2" || m.Image != img || !m.Inserted {
			t.Fatalf("CDMedia = %+v, %v", m, err)
		}
		if err := c.EjectMedia(ctx); err != nil {
			t.Fatalf("EjectMedia: %v", err)
		}
		if _, in := s.MediaAt(mediaColl + "/CD2"); in {
			t.Fatal("CD2 still inserted after EjectMedia")
		}
	}

	// Without the failure the first slot that takes a CD is used.
	s := redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "media-slots")})
	if err := client(t, s).InsertMedia(context.Background(), img); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.MediaAt(mediaColl + "/CD1"); got != img {
		t.Fatalf("CD1 holds %q", got)
	}

	// Every slot refusing: the error names what was tried; another error
	// (a 500) is not passed over.
	s = redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "media-slots"), Fail: map[string]int{
		"POST " + mediaColl + "/CD1/Actions/VirtualMedia.InsertMedia": 405,
		"POST " + mediaColl + "/CD2/Actions/VirtualMedia.InsertMedia": 404,
	}})
	err := client(t, s).InsertMedia(context.Background(), img)
	if err == nil || !strings.Contains(err.Error(), "CD1") || !strings.Contains(err.Error(), "CD2") {
		t.Fatalf("all slots refusing: %v", err)
	}
	s = redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "media-slots"),
		Fail: map[string]int{"POST " + mediaColl + "/CD1/Actions/VirtualMedia.InsertMedia": 500}})
	if err := client(t, s).InsertMedia(context.Background(), img); redfish.StatusOf(err) != 500 {
		t.Fatalf("a 500 from CD1: %v; want it returned", err)
	}
	if _, in := s.MediaAt(mediaColl + "/CD2"); in {
		t.Fatal("fell through on a 500")
	}
}

// TestMediaSlotWithoutTypesOrActions: a slot that lists no MediaTypes and
// advertises no InsertMedia is not a CD.
func TestMediaSlotWithoutTypesOrActions(t *testing.T) {
	extra := overlay(t, "media-slots")
	extra[mediaColl+"/CD2"] = `{"@odata.type":"#VirtualMedia.v1_6_0.VirtualMedia","@odata.id":"` + mediaColl + `/CD2","Id":"CD2","Inserted":false}`
	s := redfishtest.Start(t, redfishtest.Options{Extra: extra,
		Fail: map[string]int{"POST " + mediaColl + "/CD1/Actions/VirtualMedia.InsertMedia": 405}})
	err := client(t, s).InsertMedia(context.Background(), img)
	if err == nil || strings.Contains(err.Error(), "CD2") {
		t.Fatalf("err %v; want CD1 refused and CD2 not tried", err)
	}
	for _, r := range posts(s) {
		if strings.Contains(r, "CD2") || strings.Contains(r, "Floppy1") {
			t.Fatalf("posted to a slot that takes no CD: %s", r)
		}
	}
}

// TestSupermicroOEMMedia: no standard virtual media; the manager names the
// OEM IsoConfig, which gets Host and Path and the Mount action.
func TestSupermicroOEMMedia(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "supermicro-x11"), RequireIfMatch: true})
	c := client(t, s)
	ctx := context.Background()
	if err := c.InsertMedia(ctx, "http://10.0.0.9:8080/iso/boot%20me.iso?x=1"); err != nil {
		t.Fatalf("InsertMedia: %v", err)
	}
	host, file, mounted := s.OEMMedia()
	if host != "http://10.0.0.9:8080" || file != "/iso/boot%20me.iso?x=1" || !mounted {
		t.Fatalf("OEM media %q %q mounted=%v", host, file, mounted)
	}
	m, err := c.CDMedia(ctx)
	if err != nil || !m.Inserted || m.Image != "http://10.0.0.9:8080/iso/boot%20me.iso?x=1" {
		t.Fatalf("CDMedia = %+v, %v", m, err)
	}
	// A second insert unmounts first.
	if err := c.InsertMedia(ctx, img); err != nil {
		t.Fatalf("second InsertMedia: %v", err)
	}
	got := posts(s)
	want := []string{
		"PATCH " + redfishtest.Manager + "/VM1/CfgCD",
		"POST " + redfishtest.Manager + "/VM1/CfgCD/Actions/IsoConfig.Mount",
		"POST " + redfishtest.Manager + "/VM1/CfgCD/Actions/IsoConfig.UnMount",
		"PATCH " + redfishtest.Manager + "/VM1/CfgCD",
		"POST " + redfishtest.Manager + "/VM1/CfgCD/Actions/IsoConfig.Mount",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("requests %v; want %v", got, want)
	}
	if err := c.EjectMedia(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, mounted := s.OEMMedia(); mounted {
		t.Fatal("still mounted after EjectMedia")
	}
}

// TestBIOSSettingsObject: the pending settings are where
// @Redfish.Settings.SettingsObject says (AMI's Bios/SD, HPE's lower-case
// bios/settings/), read and PATCHed there; Bios/Settings, which the
// client used to guess, does not exist on those BMCs.
func TestBIOSSettingsObject(t *testing.T) {
	for _, tc := range []struct{ name, settings string }{
		{"ami-bios-sd", redfishtest.Bios + "/SD"},
		{"hpe-bios-settings", redfishtest.System + "/bios/settings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redfishtest.Start(t, redfishtest.Options{RequireIfMatch: true,
				Extra: overlay(t, tc.name, redfishtest.Bios+"/Settings")})
			c := client(t, s)
			ctx := context.Background()
			b, err := c.BIOS(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSuffix(b.SettingsObject, "/") != tc.settings || b.Pending["ProcTurboMode"] != "Disabled" {
				t.Fatalf("bios %+v", b)
			}
			if err := c.SetBIOS(ctx, map[string]any{"ProcHyperthreading": "Disabled"}); err != nil {
				t.Fatalf("SetBIOS: %v", err)
			}
			if _, pend := s.BIOS(); pend["ProcHyperthreading"] != "Disabled" {
				t.Fatalf("server pending %v", pend)
			}
			for _, r := range s.Requests() {
				if r.Path == redfishtest.Bios+"/Settings" {
					t.Fatalf("requested the guessed path: %v", r)
				}
			}
			if got := posts(s); !slices.Equal(got, []string{"PATCH " + tc.settings}) {
				t.Fatalf("writes %v", got)
			}
		})
	}
}

// TestBIOSWithoutSettingsObject: a BIOS that names no settings object gets
// no PATCH anywhere, even though Bios/Settings exists on this server.
func TestBIOSWithoutSettingsObject(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "bios-no-settings")})
	c := client(t, s)
	ctx := context.Background()
	b, err := c.BIOS(ctx)
	if err != nil || b.Pending != nil || b.SettingsObject != "" || b.Attributes["ProcTurboMode"] != "Enabled" {
		t.Fatalf("BIOS = %+v, %v", b, err)
	}
	err = c.SetBIOS(ctx, map[string]any{"ProcHyperthreading": "Disabled"})
	if err == nil || !strings.Contains(err.Error(), "SettingsObject") {
		t.Fatalf("SetBIOS: %v; want the missing settings object named", err)
	}
	for _, r := range s.Requests() {
		if r.Path == redfishtest.Bios+"/Settings" || r.Method == http.MethodPatch {
			t.Fatalf("requested %v", r)
		}
	}
}

// TestPowerCycleOffThenOn: Supermicro's ResetTypes have no PowerCycle; a
// cycle is ForceOff, reads until Off (the system goes through PoweringOff,
// and an On sent meanwhile is refused), then On. Never ForceRestart.
func TestPowerCycleOffThenOn(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "supermicro-x11"), OffDelay: 3})
	c := client(t, s)
	c.PowerPoll = 5 * time.Millisecond
	rt, err := c.SetPower(context.Background(), redfish.PowerCycle)
	if err != nil || rt != "ForceOff,On" {
		t.Fatalf("SetPower(cycle) = %q, %v", rt, err)
	}
	if got := s.Resets(); !slices.Equal(got, []string{"ForceOff", "On"}) || s.Cycles() != 0 || s.PowerState() != "On" {
		t.Fatalf("resets %v, cycles %d, state %s", got, s.Cycles(), s.PowerState())
	}
	reads := 0
	for _, r := range s.Requests() {
		if r.Method == http.MethodGet && r.Path == redfishtest.System {
			reads++
		}
	}
	if reads < 4 { // the first read, then three while PoweringOff
		t.Fatalf("%d reads of the system; the client did not wait for Off", reads)
	}

	// A system that never reads Off is left off, with an error saying so.
	s2 := redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "supermicro-x11"), OffDelay: 1 << 30})
	c2 := client(t, s2)
	c2.PowerPoll, c2.PowerOffWait = 5*time.Millisecond, 50*time.Millisecond
	if _, err := c2.SetPower(context.Background(), redfish.PowerCycle); err == nil || !strings.Contains(err.Error(), "not turned on again") {
		t.Fatalf("never off: %v", err)
	}
	if got := s2.Resets(); !slices.Equal(got, []string{"ForceOff"}) {
		t.Fatalf("resets %v", got)
	}
}

// TestInspectPartial: the memory collection is absent (404) and one drive
// answers 500; everything else is reported and both are listed as unread.
// A drive whose health is Critical is reported with it.
func TestInspectPartial(t *testing.T) {
	const bad = redfishtest.Root + "/Chassis/1U/Drives/3D58ECBC375FD9F2"
	s := redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "storage-partial", redfishtest.System+"/Memory"),
		Fail: map[string]int{"GET " + bad: 500}})
	inv, err := client(t, s).Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Processors) != 2 || len(inv.NICs) == 0 || len(inv.Memory) != 0 {
		t.Fatalf("processors %d, nics %d, memory %d", len(inv.Processors), len(inv.NICs), len(inv.Memory))
	}
	var ids []string
	health := map[string]string{}
	for _, d := range inv.Storage {
		ids = append(ids, d.ID)
		health[d.ID] = d.Health
	}
	if !slices.Equal(ids, []string{"35D38F11ACEF7BD3", "3F5A8C54207B7233", "32ADF365C6C1B7BD"}) || health["32ADF365C6C1B7BD"] != "Critical" {
		t.Fatalf("drives %v health %v", ids, health)
	}
	var unread []string
	for _, u := range inv.Unread {
		unread = append(unread, u.Resource)
		if u.Error == "" {
			t.Errorf("unread %s without a reason", u.Resource)
		}
	}
	if !slices.Equal(unread, []string{redfishtest.System + "/Memory", bad}) {
		t.Fatalf("unread %+v", inv.Unread)
	}
}

// TestInspectSimpleStorageFallback: the system links Storage but the
// collection is absent: the drives come from SimpleStorage, and Storage is
// listed as unread.
func TestInspectSimpleStorageFallback(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{Extra: overlay(t, "storage-partial", redfishtest.System+"/Storage")})
	inv, err := client(t, s).Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Storage) != 2 || inv.Storage[0].ID != "SATA Bay 1" || inv.Storage[1].Health != "Warning" {
		t.Fatalf("storage %+v", inv.Storage)
	}
	if len(inv.Unread) != 1 || inv.Unread[0].Resource != redfishtest.System+"/Storage" {
		t.Fatalf("unread %+v", inv.Unread)
	}
	// A hostile link still fails the whole inspection.
	extra := overlay(t, "storage-partial")
	extra[redfishtest.System+"/Storage/1"] = `{"Id":"1","Drives":[{"@odata.id":"/redfish/v1/../../etc/passwd"}]}`
	s2 := redfishtest.Start(t, redfishtest.Options{Extra: extra})
	if _, err := client(t, s2).Inspect(context.Background()); !errors.Is(err, redfish.ErrOutsideRoot) {
		t.Fatalf("a drive outside /redfish/v1: %v; want ErrOutsideRoot", err)
	}
}

// TestLegacyTLS: a BMC that offers only TLS 1.2 with RSA key exchange is
// refused unless the client is enrolled with LegacyTLS, and then only with
// the right pin.
func TestLegacyTLS(t *testing.T) {
	s := redfishtest.Start(t, redfishtest.Options{LegacyTLS: true})
	ctx := context.Background()

	c := client(t, s)
	err := c.Verify(ctx)
	if err == nil || !strings.Contains(err.Error(), "legacy TLS") {
		t.Fatalf("without LegacyTLS: %v; want refused with the way out named", err)
	}
	if _, err := c.Power(ctx); err == nil {
		t.Fatal("Power without LegacyTLS succeeded")
	}
	if n := len(s.Requests()); n != 0 {
		t.Fatalf("the server saw %d requests", n)
	}

	legacy := client(t, s)
	legacy.LegacyTLS = true
	if err := legacy.Verify(ctx); err != nil {
		t.Fatalf("Verify with LegacyTLS: %v", err)
	}
	if st, err := legacy.Power(ctx); err != nil || st != "On" {
		t.Fatalf("Power with LegacyTLS = %q, %v", st, err)
	}

	wrong := client(t, s)
	wrong.LegacyTLS = true
	wrong.SPKIPin = otherPin(t)
	if err := wrong.Verify(ctx); !errors.Is(err, redfish.ErrPinMismatch) {
		t.Fatalf("LegacyTLS with a wrong pin: %v; want ErrPinMismatch", err)
	}

	// The suite really is RSA key exchange over TLS 1.2.
	conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{InsecureSkipVerify: true, CipherSuites: redfishtest.LegacyCipherSuites}) // test probe only
	if err != nil {
		t.Fatal(err)
	}
	st := conn.ConnectionState()
	conn.Close()
	if st.Version != tls.VersionTLS12 || !slices.Contains(redfishtest.LegacyCipherSuites, st.CipherSuite) {
		t.Fatalf("negotiated %x/%x", st.Version, st.CipherSuite)
	}

	// A modern BMC is still reached over TLS 1.3 with LegacyTLS on.
	m := redfishtest.Start(t, redfishtest.Options{})
	mc := client(t, m)
	mc.LegacyTLS = true
	if _, err := mc.Power(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPowerCycleUnadvertised: a system that advertises no ResetTypes and
// answers 400 to PowerCycle is cycled off, then on.
func TestPowerCycleUnadvertised(t *testing.T) {
	b, err := os.ReadFile("redfishtest/testdata/public-rackmount1/Systems/437XR1138R2/index.json")
	if err != nil {
		t.Fatal(err)
	}
	var sys map[string]any
	if err := json.Unmarshal(b, &sys); err != nil {
		t.Fatal(err)
	}
	delete(sys["Actions"].(map[string]any)["#ComputerSystem.Reset"].(map[string]any), "ResetType@Redfish.AllowableValues")
	edited, _ := json.Marshal(sys)
	s := redfishtest.Start(t, redfishtest.Options{Extra: map[string]string{redfishtest.System: string(edited)}})
	rt, err := client(t, s).SetPower(context.Background(), redfish.PowerCycle)
	if err != nil || rt != "ForceOff,On" {
		t.Fatalf("SetPower(cycle) = %q, %v", rt, err)
	}
	if got := s.Resets(); !slices.Equal(got, []string{"ForceOff", "On"}) {
		t.Fatalf("resets %v", got)
	}
}
