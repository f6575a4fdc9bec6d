package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

var host = Host{Bridges: map[string]Bridge{"br0": {MAC: "02:00:00:00:00:01", Addrs: []netip.Addr{netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("fd09::1")}}}}

func nic(mac string, policy string, addrs ...string) NIC {
	return NIC{Bridge: "br0", MAC: mac, Addresses: addrs, Policy: policy}
}

func TestTapName(t *testing.T) {
	a, b := TapName("vm-a", 0), TapName("vm-a", 1)
	if len(a) != 15 || !strings.HasPrefix(a, TapPrefix) || a == b || TapName("vm-b", 0) == a || !ifname(a) {
		t.Fatalf("TapName: %s %s", a, b)
	}
}

func TestLinkLocal(t *testing.T) {
	if got := LinkLocal("52:54:00:0a:00:01").String(); got != "fe80::5054:ff:fe0a:1" {
		t.Fatalf("LinkLocal = %s", got)
	}
}

// TestPlanFails: each NIC that cannot be expressed, or claims what is not
// its instance's, fails its instance alone; its taps are blocked.
func TestPlanFails(t *testing.T) {
	good := Instance{ID: "good", NICs: []NIC{nic("52:54:00:00:00:09", Private, "10.9.0.9/24")}}
	for _, c := range []struct {
		name   string
		in     []Instance
		failed []string
		want   string
	}{
		{"host bridge address", []Instance{{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", Egress, "10.9.0.1/24")}}}, []string{"a"}, "host bridge br0's own"},
		{"host bridge IPv6", []Instance{{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", Egress, "fd09::1/64")}}}, []string{"a"}, "host bridge br0's own"},
		{"host bridge MAC", []Instance{{ID: "a", NICs: []NIC{nic("02:00:00:00:00:01", Egress)}}}, []string{"a"}, "host bridge br0's own"},
		{"EC2 metadata address", []Instance{{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", Egress, "169.254.169.254/16")}}}, []string{"a"}, "address"},
		{"unknown bridge", []Instance{{ID: "a", NICs: []NIC{{Bridge: "br9", MAC: "52:54:00:00:00:01", Policy: Egress}}}}, []string{"a"}, "not a bridge of this host"},
		{"PRIVATE without addresses", []Instance{{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", Private)}}}, []string{"a"}, "cannot be expressed"},
		{"NONE without addresses", []Instance{{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", None)}}}, []string{"a"}, "cannot be expressed"},
		{"unknown policy", []Instance{{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", "OPEN")}}}, []string{"a"}, "policy"},
		{"multicast MAC", []Instance{{ID: "a", NICs: []NIC{nic("01:00:5e:00:00:01", Egress)}}}, []string{"a"}, "mac"},
		{"address claimed twice", []Instance{
			{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", Egress, "10.9.0.5/24")}},
			{ID: "b", NICs: []NIC{nic("52:54:00:00:00:02", Egress, "10.9.0.5/24")}}}, []string{"a", "b"}, "also instance"},
		{"MAC claimed twice", []Instance{
			{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", Egress)}},
			{ID: "b", NICs: []NIC{nic("52:54:00:00:00:01", Egress)}}}, []string{"a", "b"}, "also instance"},
		{"network address", []Instance{{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", Egress, "10.9.0.0/24")}}}, []string{"a"}, "network or broadcast"},
		{"loopback", []Instance{{ID: "a", NICs: []NIC{nic("52:54:00:00:00:01", Egress, "127.0.0.2/8")}}}, []string{"a"}, "unicast"},
	} {
		t.Run(c.name, func(t *testing.T) {
			taps, blocked, failed := Plan(append(c.in, good), host)
			if len(failed) != len(c.failed) {
				t.Fatalf("failed %v, want %v", failed, c.failed)
			}
			for _, id := range c.failed {
				if !strings.Contains(failed[id], c.want) {
					t.Errorf("%s failed %q, want %q", id, failed[id], c.want)
				}
				if !contains(blocked, TapName(id, 0)) {
					t.Errorf("tap of %s not blocked: %v", id, blocked)
				}
			}
			if len(taps) != 1 || taps[0].Instance != "good" {
				t.Errorf("taps %v, want only good's", taps)
			}
			if _, err := Render(taps, host); err != nil {
				t.Errorf("Render of the good taps: %v", err)
			}
		})
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestRenderRefuses: Render binds no tap but its instance's, and never the
// host's own addresses, whatever a caller hands it.
func TestRenderRefuses(t *testing.T) {
	taps, _, failed := Plan([]Instance{{ID: "vm-a", NICs: []NIC{nic("52:54:00:00:00:01", Private, "10.9.0.5/24")}}}, host)
	if len(failed) > 0 {
		t.Fatal(failed)
	}
	for _, c := range []struct {
		name string
		edit func(*Tap)
		want string
	}{
		{"a tap of another instance", func(tp *Tap) { tp.Name = TapName("vm-b", 0) }, "not this instance's"},
		{"the host bridge's address", func(tp *Tap) { tp.Addrs = []netip.Prefix{netip.MustParsePrefix("10.9.0.1/24")} }, "host bridge"},
		{"an unknown bridge", func(tp *Tap) { tp.Bridge = "br9" }, "not a bridge"},
		{"a bridge name with a quote", func(tp *Tap) { tp.Bridge = `br0" accept` }, "not a NIC"},
		{"PRIVATE without addresses", func(tp *Tap) { tp.Addrs = nil }, "without addresses"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tp := taps[0]
			c.edit(&tp)
			if _, err := Render([]Tap{tp}, host); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Render: %v, want %q", err, c.want)
			}
		})
	}
	two := []Tap{taps[0], taps[0]}
	two[1].Name, two[1].Instance = TapName("vm-b", 0), "vm-b"
	if _, err := Render(two, host); err == nil || !strings.Contains(err.Error(), "both") {
		t.Fatalf("two taps with one MAC and address: %v", err)
	}
}

// TestRenderShape: the ruleset replaces exactly bcd's three tables, and
// names nothing else.
func TestRenderShape(t *testing.T) {
	taps, _, _ := Plan([]Instance{{ID: "vm-a", NICs: []NIC{nic("52:54:00:00:00:01", None, "10.9.0.5/24", "fd09::5/64")}}}, Host{Bridges: host.Bridges, EC2: true})
	out, err := Render(taps, Host{Bridges: host.Bridges, EC2: true})
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{"delete table bridge bcd_instances\n", "delete table inet bcd_taps\n", "delete table arp bcd_taps\n", "ip daddr 169.254.169.254 drop", "ip6 daddr fd00:ec2::254 drop"} {
		if !strings.Contains(s, want) {
			t.Errorf("ruleset lacks %q", want)
		}
	}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "table" && !contains(Tables, strings.TrimSuffix(strings.Join(f[1:], " "), " {")) {
			t.Errorf("ruleset names table %q", line)
		}
		if strings.Contains(line, "ruleset") || strings.Contains(line, "include") {
			t.Errorf("ruleset line %q", line)
		}
	}
}

func TestDecode(t *testing.T) {
	in, err := Decode([]byte(`{"images":[],"instances":[{"id":"vm-a","vcpus":1,"nics":[{"bridge":"br0","mac":"52:54:00:00:00:01","addresses":["10.9.0.5/24"],"policy":"PRIVATE"}]},{"id":"vm-b"}]}`))
	if err != nil || len(in) != 2 || len(in[0].NICs) != 1 || in[0].NICs[0].Policy != Private || len(in[1].NICs) != 0 {
		t.Fatalf("Decode: %v %+v", err, in)
	}
	for _, bad := range []string{
		`{"instances":[{"id":"a","nics":[{"bridge":"br0","mac":"52:54:00:00:00:01","policy":"EGRESS","rules":"accept"}]}]}`,
		`{"instances":[{"id":"a","nics":{}}]}`,
		`{"instances":`,
	} {
		if _, err := Decode([]byte(bad)); err == nil {
			t.Errorf("Decode(%s) took it", bad)
		}
	}
	if in, err := Decode(nil); err != nil || in != nil {
		t.Errorf("Decode(nil): %v %v", in, err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"instances":[{"id":"vm-a","nics":[{"bridge":"br0","mac":"52:54:00:00:00:01","addresses":["10.9.0.5/24","fd09::5/64"],"policy":"PRIVATE"}]}]}`))
	f.Add([]byte(`{"instances":[{"id":"vm-a","nics":[{"bridge":"br0\"","mac":"52:54:00:00:00:01","policy":"EGRESS"}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := Decode(b)
		if err != nil {
			return
		}
		taps, _, _ := Plan(in, host)
		out, err := Render(taps, host)
		if err != nil {
			t.Fatalf("Plan's taps refused by Render: %v", err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Count(line, `"`)%2 != 0 || strings.ContainsAny(line, ";#") && !strings.HasPrefix(strings.TrimSpace(line), "type filter") && !strings.HasPrefix(line, "#") {
				t.Fatalf("line %q", line)
			}
		}
	})
}
