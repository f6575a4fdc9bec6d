package redfish

import (
	"encoding/json"
	"fmt"
	"net/url"
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

// checkLinks fails when a link the client would follow resolves outside
// /redfish/v1 on the BMC's own host.
func checkLinks(t *testing.T, links ...string) {
	t.Helper()
	const host = "10.0.0.5:443"
	for _, l := range links {
		if l == "" {
			continue
		}
		p, _, err := resolveLink(host, l)
		if err != nil {
			continue
		}
		if c := path.Clean(p); !underRoot(c) || strings.TrimSuffix(p, "/") != c {
			t.Fatalf("link %q resolved to %q outside %s", l, p, Root)
		}
	}
}

func checkOutput(t *testing.T, v any) {
	t.Helper()
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("does not marshal: %v", err)
	}
	var round any
	if err := json.Unmarshal(out, &round); err != nil {
		t.Fatalf("output %s does not parse back: %v", out, err)
	}
	if strings.ContainsAny(fmt.Sprint(round), "\x00\n\r\x1b") {
		t.Fatalf("control characters in %s", out)
	}
}

func seed(f *testing.F, paths ...string) {
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// FuzzParseVirtualMedia: a VirtualMedia body never panics the reader, the
// slot choice is decided, the reported media is printable, and its action
// targets resolve under /redfish/v1 or are refused.
func FuzzParseVirtualMedia(f *testing.F) {
	seed(f, "testdata/media-slots/Systems/437XR1138R2/VirtualMedia/CD1/index.json",
		"testdata/media-slots/Systems/437XR1138R2/VirtualMedia/CD2/index.json",
		"testdata/media-slots/Systems/437XR1138R2/VirtualMedia/Floppy1/index.json")
	f.Add([]byte(`{"MediaTypes":null,"Actions":{"#VirtualMedia.InsertMedia":{"target":"https://evil/redfish/v1/x"}}}`))
	f.Add([]byte(`{"MediaTypes":[],"Inserted":"true","Image":"\u0000\u001b[2J"}`))
	f.Add([]byte(`{"MediaTypes":"CD"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		vm, err := parseVirtualMedia(b)
		if err != nil {
			return
		}
		takes := vm.takesCD()
		if vm.MediaTypes == nil && vm.Actions.Insert.Target == "" && takes {
			t.Fatal("a slot with neither MediaTypes nor InsertMedia was taken as a CD")
		}
		checkOutput(t, vm.media())
		checkLinks(t, vm.Actions.Insert.Target, vm.Actions.Eject.Target)
	})
}

// FuzzParseManagerMedia: a Manager body's virtual media links (standard
// and Supermicro OEM) never panic the reader and resolve under /redfish/v1
// or are refused.
func FuzzParseManagerMedia(f *testing.F) {
	seed(f, "testdata/supermicro-x11/Managers/BMC/index.json")
	f.Add([]byte(`{"VirtualMedia":{"@odata.id":"/redfish/v1/../x"},"Oem":{"Supermicro":{"VirtualMediaConfig":{"@odata.id":"//evil/redfish/v1/VM1"}}}}`))
	f.Add([]byte(`{"Oem":{"Supermicro":[]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseManagerMedia(b)
		if err != nil {
			return
		}
		checkLinks(t, m.VirtualMedia.ID, m.Oem.Supermicro.VirtualMediaConfig.ID)
	})
}

// FuzzSMCShare: every image URL the client accepts splits into a Host of
// scheme://host[:port] and a Path that starts with "/", and the two
// together give the URL back.
func FuzzSMCShare(f *testing.F) {
	for _, s := range []string{"https://images.example/install.iso?v=2", "http://10.0.0.9:8080/iso/boot%20me.iso?x=1",
		"http://[fd00::1]:81", "https://h/a/../b?c#d", "http://h/%2F%2e%2e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidImageURL(s) != nil {
			return
		}
		host, file, err := smcShare(s)
		if err != nil {
			t.Fatalf("smcShare(%q): %v although the URL is valid", s, err)
		}
		if strings.Count(host, "/") != 2 || !strings.HasPrefix(file, "/") {
			t.Fatalf("smcShare(%q) = %q, %q", s, host, file)
		}
		u, _ := url.Parse(host + file)
		v, _ := url.Parse(s)
		if u == nil || u.Host != v.Host || u.Scheme != v.Scheme || u.RawQuery != v.RawQuery {
			t.Fatalf("smcShare(%q) = %q + %q does not give the URL back", s, host, file)
		}
	})
}

// FuzzParseBIOS: a Bios body never panics the reader; the settings object
// is taken only as the body names it (never guessed) and resolves under
// /redfish/v1 or is refused; the attributes reported are scalars.
func FuzzParseBIOS(f *testing.F) {
	seed(f, "testdata/ami-bios-sd/Systems/437XR1138R2/Bios/index.json",
		"testdata/hpe-bios-settings/Systems/437XR1138R2/Bios/index.json",
		"testdata/bios-no-settings/Systems/437XR1138R2/Bios/index.json")
	f.Add([]byte(`{"Attributes":{"A":{"x":1},"B":[1],"C":null,"D":1e999},"@Redfish.Settings":{"SettingsObject":{"@odata.id":"/redfish/v1/../../etc"}}}`))
	f.Add([]byte(`{"@Redfish.Settings":{"SettingsObject":"x"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		bios, err := parseBIOS(b)
		if err != nil {
			return
		}
		target, err := biosSettingsPath(Root+"/Systems/1/Bios", bios.Settings.SettingsObject.ID)
		if (err == nil) != (bios.Settings.SettingsObject.ID != "") || (err == nil && target != bios.Settings.SettingsObject.ID) {
			t.Fatalf("settings object %q gave %q, %v", bios.Settings.SettingsObject.ID, target, err)
		}
		checkLinks(t, target)
		for k, v := range scalars(bios.Attributes) {
			switch v.(type) {
			case string, json.Number, bool, nil:
			default:
				t.Fatalf("attribute %q is %T", k, v)
			}
		}
		checkOutput(t, &BIOS{Registry: clean(bios.Registry, 128), Attributes: scalars(bios.Attributes)})
		_ = settingsApplyTime(bios.Settings.ApplyTimes)
	})
}

// FuzzInspectBodies: the bodies Inspect reads (processor, memory, NIC,
// Storage, Drive, SimpleStorage) never panic the readers, what they report
// is printable, MACs are normalized or empty, and drive links resolve
// under /redfish/v1 or are refused.
func FuzzInspectBodies(f *testing.F) {
	seed(f, "testdata/storage-partial/Systems/437XR1138R2/Storage/1/index.json",
		"testdata/storage-partial/Chassis/1U/Drives/32ADF365C6C1B7BD/index.json",
		"redfishtest/testdata/public-rackmount1/Systems/437XR1138R2/SimpleStorage/1/index.json",
		"redfishtest/testdata/public-rackmount1/Systems/437XR1138R2/EthernetInterfaces/12446A3B0411/index.json",
		"redfishtest/testdata/public-rackmount1/Systems/437XR1138R2/Processors/CPU1/index.json",
		"redfishtest/testdata/public-rackmount1/Systems/437XR1138R2/Memory/DIMM1/index.json")
	f.Add([]byte(`{"Drives":[{"@odata.id":"https://10.0.0.6/redfish/v1/d"}],"Devices":[{"Name":"\u001b[31m","CapacityBytes":"9e99"}],"MACAddress":"12-44-6A-3B-04-11"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d driveBody
		if decode(b, &d) == nil {
			checkOutput(t, d.drive("c"))
		}
		var st storageBody
		if decode(b, &st) == nil {
			for _, l := range st.Drives {
				checkLinks(t, l.ID)
			}
		}
		inv := &Inventory{}
		for _, read := range []func([]byte, *Inventory) error{readProcessor, readMemory, readNIC, readSimpleStorage} {
			_ = read(b, inv)
		}
		checkOutput(t, inv)
		var n nicBody
		if decode(b, &n) == nil {
			for _, m := range []string{normalMAC(n.MAC), normalMAC(n.PermanentMAC)} {
				if m != "" && (len(m) != 17 || strings.ToLower(m) != m) {
					t.Fatalf("MAC %q", m)
				}
			}
		}
	})
}
