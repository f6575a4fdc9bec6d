package seed

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
)

const userData = "#cloud-config\nruncmd:\n  - echo s3cr3t-token > /root/proof\n"

// TestReadBack writes a seed and reads it back with two readers that are
// not ours: isoinfo (genisoimage) and xorriso, and blkid for the label
// cloud-init looks for.
func TestReadBack(t *testing.T) {
	isoinfo := testenv.NeedTool(t, "isoinfo", "genisoimage")
	xorriso := testenv.NeedTool(t, "xorriso", "xorriso")
	blkid := testenv.NeedTool(t, "blkid", "util-linux")
	nics := []Interface{{MAC: "52:54:00:0a:00:05", Addresses: []netip.Prefix{netip.MustParsePrefix("10.9.0.5/24")}}}
	netcfg, err := NetworkConfig(nics)
	if err != nil {
		t.Fatal(err)
	}
	// A user data spanning sectors, to place the next file past them.
	big := userData + strings.Repeat("# padding\n", 500)
	for _, tt := range []struct {
		name  string
		s     Seed
		files map[string]string
	}{
		{"with network", Seed{InstanceID: "vm-1", Hostname: "web1", UserData: []byte(big), Interfaces: nics},
			map[string]string{"meta-data": "instance-id: vm-1\nlocal-hostname: web1\n", "user-data": big, "network-config": string(netcfg)}},
		{"no user data", Seed{InstanceID: "Vm_2"},
			map[string]string{"meta-data": "instance-id: Vm_2\nlocal-hostname: vm-2\n", "user-data": ""}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "seed.iso")
			if err := WriteFile(p, tt.s); err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(p)
			if err != nil || st.Mode().Perm() != 0o640 {
				t.Fatalf("seed file: %v, %v; want mode 0640", st.Mode(), err)
			}
			out := run(t, blkid, "-o", "value", "-s", "LABEL", p)
			if strings.TrimSpace(out) != Label {
				t.Errorf("blkid label %q, want %q", out, Label)
			}
			if d := run(t, isoinfo, "-d", "-i", p); !strings.Contains(d, "Volume id: cidata") {
				t.Errorf("isoinfo -d:\n%s", d)
			}
			list := run(t, xorriso, "-indev", p, "-find", "/", "-type", "f")
			for name, want := range tt.files {
				if got := run(t, isoinfo, "-i", p, "-x", "/"+name+";1"); got != want {
					t.Errorf("isoinfo reads %s as %q, want %q", name, got, want)
				}
				if !strings.Contains(list, "'/"+name+"'") {
					t.Errorf("xorriso does not list /%s:\n%s", name, list)
				}
				x := filepath.Join(t.TempDir(), name)
				run(t, xorriso, "-osirrox", "on", "-indev", p, "-extract", "/"+name, x)
				if got, _ := os.ReadFile(x); string(got) != want {
					t.Errorf("xorriso extracts %s as %q, want %q", name, got, want)
				}
			}
			n := 0
			for _, l := range strings.Split(list, "\n") {
				if strings.HasPrefix(l, "'/") {
					n++
				}
			}
			if n != len(tt.files) {
				t.Errorf("xorriso lists %d files, want %d:\n%s", n, len(tt.files), list)
			}
		})
	}
}

func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\n%s", bin, args, err, stderr.String())
	}
	return stdout.String()
}

// TestRefusals: what meta-data is rendered from is checked, and a refusal
// never carries the user data.
func TestRefusals(t *testing.T) {
	for _, tt := range []struct {
		name    string
		s       Seed
		wantErr string
	}{
		{"newline in id", Seed{InstanceID: "vm\nlocal-hostname: x"}, "instance id"},
		{"empty id", Seed{}, "instance id"},
		{"hostname with dot", Seed{InstanceID: "vm", Hostname: "a.b"}, "DNS label"},
		{"hostname dash", Seed{InstanceID: "vm", Hostname: "-a"}, "DNS label"},
		{"user data too big", Seed{InstanceID: "vm", UserData: []byte(userData + strings.Repeat("x", MaxUserData))}, "at most"},
		{"interface it cannot express", Seed{InstanceID: "vm", UserData: []byte(userData), Interfaces: []Interface{{MAC: "52:54:00:00:00:01"}}}, "1 to 16"},
	} {
		_, err := Build(tt.s)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: Build = %v, want %q", tt.name, err, tt.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: the error carries the user data: %v", tt.name, err)
		}
	}
}
