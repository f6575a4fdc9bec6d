package qemutests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stepSlices: a GPU hold with a cpulist and a memory limit gets its
// bcd-alloc-<id>.slice in the guest's systemd with those limits (read
// back from systemd), and its release stops the slice and removes it. A
// fakehw node (fake GPUs) runs as root beside the installed bcd, its
// slices the guest's real ones (BCD_FAKEHW_HOST_SLICES=1).
func stepSlices(t *testing.T, e *systemdEnv) {
	bin := filepath.Join(t.TempDir(), "bcd-node-fakehw")
	b := exec.Command("go", "build", "-trimpath", "-tags", "fakehw", "-o", bin, "./roles/node")
	b.Dir, b.Env = e.repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags fakehw ./roles/node: %v\n%s", err, out)
	}
	if err := e.g.Copy(bin, "/root/fk/bcd", 0o755); err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(e.bcgw(t, "token", "create", "--uses", "1"))
	if err := e.g.Put("/root/fk/token", []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pins := strings.Join(strings.Fields(e.bcgw(t, "well-known", "--pins")), " ")
	e.g.Must(fmt.Sprintf("/root/fk/bcd join --config /root/fk/config.toml --data-dir /root/fk/data --server https://%s:8443 %s --token-file /root/fk/token", guestHostIP, pins))
	e.g.Must(`sed -i 's|^socket_path = .*|socket_path = "/root/fk/run/bcd.sock"|' /root/fk/config.toml && mkdir -p /root/fk/run`)
	e.g.Must("systemd-run --unit=bcd-fakehw --setenv=BCD_FAKEHW_HOST_SLICES=1 /root/fk/bcd node --config /root/fk/config.toml")
	var id struct {
		NodeID string `json:"node_id"`
	}
	if err := json.Unmarshal([]byte(e.g.Must("cat /root/fk/data/identity.json")), &id); err != nil {
		t.Fatal(err)
	}
	defer e.g.Run("systemctl stop bcd-fakehw")
	observed := func(gen string) {
		t.Helper()
		want, _ := strconv.ParseUint(strings.TrimSpace(gen), 10, 64)
		waitFor(t, "the fakehw node to converge its devices section", 90*time.Second, func() bool {
			var st struct {
				ObservedGeneration uint64 `json:"observed_generation"`
				Sections           []struct{ Name, State string }
			}
			out, err := exec.Command(e.bin, "status", id.NodeID, "--json", "--data-dir", e.gwDir).Output()
			if err != nil || json.Unmarshal(out, &st) != nil || st.ObservedGeneration < want {
				return false
			}
			for _, s := range st.Sections {
				if s.Name == "devices" && s.State != "CONVERGED" {
					t.Fatalf("devices section %s:\n%s", s.State, out)
				}
			}
			return true
		})
	}
	observed(e.bcgw(t, "hold", id.NodeID, "--alloc", "slice1", "--gpu", "0", "--cpus", "0", "--memory", "268435456"))
	p := e.g.SliceLimits("bcd-alloc-slice1.slice")
	t.Logf("bcd-alloc-slice1.slice as systemd reads it: %v", p)
	if p["ActiveState"] != "active" || p["AllowedCPUs"] != "0" || p["MemoryMax"] != "268435456" {
		t.Errorf("the hold's slice: %v, want active with AllowedCPUs=0 and MemoryMax=268435456", p)
	}
	observed(e.bcgw(t, "release", id.NodeID, "--alloc", "slice1"))
	if p := e.g.Show("bcd-alloc-slice1.slice", "ActiveState", "LoadState"); p["ActiveState"] != "inactive" {
		t.Errorf("the released hold's slice: %v, want inactive", p)
	}
	if _, code, _ := e.g.Run("test -e /run/systemd/system/bcd-alloc-slice1.slice.d/50-bcd.conf"); code == 0 {
		t.Error("the released hold's slice drop-in is still there")
	}
}
