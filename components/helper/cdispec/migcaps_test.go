package cdispec

import (
	"slices"
	"strings"
	"testing"
)

func TestMIGCaps(t *testing.T) {
	caps, err := ParseMIGCaps(RenderMIGCaps())
	if err != nil {
		t.Fatal(err)
	}
	if len(caps) != 2+migGPUs*migGIs*(1+migCIs) {
		t.Errorf("%d capabilities", len(caps))
	}
	// The driver's numbering: gpu0/gi0/access is 3, its compute instances
	// 4 to 11, gpu0/gi1/access 12.
	nodes, err := caps.Nodes(0, 1, 0)
	if err != nil || strings.Join(nodes, " ") != "/dev/nvidia-caps/nvidia-cap12 /dev/nvidia-caps/nvidia-cap13" {
		t.Errorf("Nodes(0, 1, 0) = %v, %v", nodes, err)
	}
	if _, err := caps.Nodes(0, 15, 0); err == nil {
		t.Error("Nodes of GPU instance 15 (beyond the driver's 0 to 14) gave no error")
	}
	allowed := caps.Allowed([]int{3})
	if len(allowed) != migGIs*(1+migCIs) {
		t.Errorf("Allowed(3) has %d nodes", len(allowed))
	}
	for _, priv := range []string{CapNode(1), CapNode(2)} {
		if slices.Contains(caps.Allowed([]int{0, 1, 2, 3}), priv) {
			t.Errorf("%s (config or monitor) is allowed", priv)
		}
	}
	n3, _ := caps.Nodes(3, 2, 0)
	n0, _ := caps.Nodes(0, 2, 0)
	if !slices.Contains(allowed, n3[0]) || slices.Contains(allowed, n0[0]) {
		t.Errorf("Allowed(3) = ... does not hold GPU 3's instances only")
	}
}

func TestParseMIGCapsRefuses(t *testing.T) {
	for _, bad := range []string{
		"config 1\nconfig 2\n",
		"config 1\nmonitor 1\n",
		"gpu0/gi0/access 01\n",
		"gpu32/gi0/access 3\n",
		"gpu0/gi15/access 3\n",
		"gpu0/gi0/ci8/access 3\n",
		"gpu0/gi0 3\n",
		"gpu0/gi0/access -3\n",
		"gpu0/gi0/access  3\n",
		"other 3\n",
		"config 1\n\nmonitor 2\n",
	} {
		if _, err := ParseMIGCaps([]byte(bad)); err == nil {
			t.Errorf("ParseMIGCaps(%q) gave no error", bad)
		}
	}
}

func TestRenderMIGHoldPassesCheck(t *testing.T) {
	caps, _ := ParseMIGCaps(RenderMIGCaps())
	nodes, _ := caps.Nodes(2, 3, 0)
	g := GPU{UUID: "MIG-11112222-3333-4444-5555-666677778888", Node: "/dev/nvidia2", Caps: nodes}
	spec, err := Render("m1", []GPU{g})
	if err != nil {
		t.Fatal(err)
	}
	allowed := append(caps.Allowed([]int{2}), "/dev/nvidia2")
	if err := Check("m1", spec, func(p string) bool { return slices.Contains(allowed, p) }); err != nil {
		t.Errorf("Check of a MIG hold's spec: %v", err)
	}
	// The same spec on a host whose helper allows only GPU 2's own node
	// (no MIG capabilities), or with the config capability, is refused.
	if err := Check("m1", spec, func(p string) bool { return p == "/dev/nvidia2" }); err == nil {
		t.Error("a capability node the checker does not allow passed")
	}
	g.Caps = []string{CapNode(1)}
	spec, _ = Render("m1", []GPU{g})
	if err := Check("m1", spec, func(p string) bool { return slices.Contains(allowed, p) }); err == nil {
		t.Error("the config capability passed")
	}
	if _, err := Render("m1", []GPU{{UUID: g.UUID, Node: "/dev/nvidia2", Caps: []string{"/dev/sda"}}}); err == nil {
		t.Error("Render took a capability that is not an nvidia-caps node")
	}
}

func FuzzParseMIGCaps(f *testing.F) {
	f.Add([]byte("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		caps, err := ParseMIGCaps(b)
		if err != nil {
			return
		}
		seen := map[int]bool{}
		for name, m := range caps {
			if !capName(name) || seen[m] {
				t.Fatalf("accepted %q -> %d", name, m)
			}
			seen[m] = true
		}
		for _, n := range caps.Allowed([]int{0, 1}) {
			if n == CapNode(caps["config"]) && caps.has("config") || n == CapNode(caps["monitor"]) && caps.has("monitor") {
				t.Fatalf("Allowed gives a privileged capability %s", n)
			}
		}
	})
}
