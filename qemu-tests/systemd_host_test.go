package qemutests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hostSpec is the host section the step sends: a module the guest's
// kernel has with an option, a sysctl, a 2 MiB pool, and a kernel
// command-line change (iommu=pt, harmless in a guest without an IOMMU).
const hostSpec = `{"host":{"kernel-modules":{"modules":[{"name":"dummy","options":{"numdummies":"3"}}]},` +
	`"sysctl":{"settings":{"vm.swappiness":"17"}},"hugepages":{"pages_2m":8},"iommu":{"passthrough":true}}}`

// stepHostUnits: the host section from a signed spec (bcgw spec patch),
// applied by the unprivileged node through bcd helper's host.unit on a
// real kernel, systemd and GRUB: each unit's effect seen for real,
// RebootRequired for the command line until node.reboot boots it, and a
// hand edit of the sysctl file put back by one repair pass.
func stepHostUnits(t *testing.T, e *systemdEnv) {
	g := e.g
	// A short repair interval (root's config; the node reads it).
	g.Must(`grep -q '^\[host\]' /etc/bcd/config.toml || printf '\n[host]\nrepair_interval = "5s"\n' >> /etc/bcd/config.toml`)
	g.Must("systemctl restart bcd.service")
	g.WaitActive("bcd.service", 60*time.Second)
	e.connected(t)
	if out, _, _ := g.Run("lsmod | grep -c '^dummy '"); strings.TrimSpace(out) != "0" {
		t.Fatalf("dummy is loaded before the step: %q", out)
	}
	since := e.guestNow(t)
	gen := e.specPatch(t, hostSpec)
	start := time.Now()
	e.waitSection(t, e.nodeID, gen, "host", "CONVERGED")
	t.Logf("host section CONVERGED at generation %d in %s", gen, time.Since(start).Round(100*time.Millisecond))

	// Each applied for real.
	checkApplied := func(when string) {
		t.Helper()
		if n := strings.TrimSpace(g.Must("ip -o link show type dummy | wc -l")); n != "3" {
			t.Errorf("%s: %s dummy links, want 3 (numdummies=3):\n%s", when, n, g.Must("lsmod | grep dummy; ip -o link"))
		}
		if v := strings.TrimSpace(g.Must("sysctl -n vm.swappiness")); v != "17" {
			t.Errorf("%s: vm.swappiness %s, want 17", when, v)
		}
		if v := strings.TrimSpace(g.Must("awk '/^HugePages_Total:/ {print $2}' /proc/meminfo")); v != "8" {
			t.Errorf("%s: HugePages_Total %s, want 8", when, v)
		}
	}
	checkApplied("after the spec")
	t.Logf("the units' files:\n%s", g.Must("head -n 20 /etc/modules-load.d/bcd.conf /etc/modprobe.d/zz-bcd.conf /etc/sysctl.d/90-bcd*.conf /etc/default/grub.d/60-bcd-*.cfg"))
	if !strings.Contains(g.Must("grep -m1 -E '^\\s*linux\\s' /boot/grub/grub.cfg"), "iommu=pt") {
		t.Errorf("update-grub's grub.cfg lacks iommu=pt:\n%s", g.Must("grep -E '^\\s*linux\\s' /boot/grub/grub.cfg"))
	}
	if strings.Contains(g.Must("cat /proc/cmdline"), "iommu=pt") {
		t.Fatal("/proc/cmdline has iommu=pt before any reboot")
	}
	units := map[string]bool{}
	for _, o := range e.helperOps(t, since) {
		if o["op"] == "host.unit" && o["outcome"] == "ok" && fmt.Sprint(o["uid"]) == e.bcdUID {
			units[fmt.Sprint(o["unit"])] = true
		}
	}
	t.Logf("host.unit calls from uid %s that succeeded: %v", e.bcdUID, units)
	if len(units) == 0 {
		t.Errorf("no host.unit from the bcd account in the helper's journal:\n%s", e.journalSince(t, since, "-u bcd-helper.service"))
	}
	e.waitCondition(t, "RebootRequired", true)
	// nvidia-driver against real apt: installed and pinned.
	nv := newNvidiaCheck(t, e)
	nv.install(t)
	st, _, _ := g.Run("bcd status 2>&1 | sed -n '/^generation/,/^lanes/p'")
	t.Logf("bcd status in the guest:\n%s", st)
	if !strings.Contains(st, "unit    iommu CONVERGED") || !strings.Contains(st, "RebootRequired host") {
		t.Errorf("bcd status lacks the iommu unit or RebootRequired:\n%s", st)
	}

	// A hand edit of the sysctl file is put back by the repair pass.
	g.Must("printf 'vm.swappiness = 99\\n' > /etc/sysctl.d/90-bcd.conf && sysctl -q -w vm.swappiness=99")
	edited := time.Now()
	waitFor(t, "the hand edit of /etc/sysctl.d/90-bcd.conf repaired", time.Minute, func() bool {
		out, _, _ := g.Run("grep -c '^vm.swappiness = 17$' /etc/sysctl.d/90-bcd.conf; sysctl -n vm.swappiness")
		return strings.Fields(out) != nil && slices.Equal(strings.Fields(out), []string{"1", "17"})
	})
	t.Logf("hand edit repaired in %s (repair_interval 5s)", time.Since(edited).Round(100*time.Millisecond))
	// That pass left the driver alone; then a version change.
	nv.secondPass(t)
	nv.change(t)

	// node.reboot boots the line GRUB renders; the condition goes.
	boot := g.Must("cat /proc/sys/kernel/random/boot_id")
	g.RebootBy(func() { e.bcgw(t, "run", e.nodeID, "node.reboot", "--body", `{"reason":"host units: RebootRequired"}`) })
	if g.Must("cat /proc/sys/kernel/random/boot_id") == boot {
		t.Fatal("the boot id did not change: no reboot happened")
	}
	g.WaitActive("bcd.service", 90*time.Second)
	e.connected(t)
	if c := g.Must("cat /proc/cmdline"); !strings.Contains(c, "iommu=pt") {
		t.Fatalf("/proc/cmdline after node.reboot lacks iommu=pt: %s", c)
	}
	e.waitCondition(t, "RebootRequired", false)
	checkApplied("after the reboot (systemd-modules-load and systemd-sysctl from the units' files)")
	nv.afterReboot(t)

	// Nothing asked: the units remove their files; GRUB renders without.
	gen = e.specPatch(t, `{"host":null}`)
	e.waitSection(t, e.nodeID, gen, "host", "CONVERGED")
	if out, _, _ := g.Run("ls /etc/modules-load.d/bcd.conf /etc/modprobe.d/zz-bcd.conf /etc/sysctl.d/90-bcd.conf /etc/sysctl.d/90-bcd-hugepages.conf /etc/default/grub.d/60-bcd-iommu.cfg 2>/dev/null"); strings.TrimSpace(out) != "" {
		t.Errorf("files left after the host section was removed:\n%s", out)
	}
	if strings.Contains(g.Must("grep -m1 -E '^\\s*linux\\s' /boot/grub/grub.cfg"), "iommu=pt") {
		t.Error("grub.cfg still has iommu=pt after the iommu unit was removed")
	}
	nv.removed(t)
}

// specPatch applies a merge patch to the node's spec with bcgw spec patch
// and returns the new generation.
func (e *systemdEnv) specPatch(t *testing.T, patch string) uint64 {
	t.Helper()
	f := filepath.Join(t.TempDir(), "patch.json")
	if err := os.WriteFile(f, []byte(patch), 0o644); err != nil {
		t.Fatal(err)
	}
	out := strings.TrimSpace(e.bcgw(t, "spec", "patch", e.nodeID, "--file", f))
	gen, err := strconv.ParseUint(out, 10, 64)
	if err != nil {
		t.Fatalf("bcgw spec patch printed %q", out)
	}
	return gen
}

// waitCondition waits until bcgw status shows the node with (or without)
// a condition of type typ.
func (e *systemdEnv) waitCondition(t *testing.T, typ string, want bool) {
	t.Helper()
	var last string
	waitFor(t, "condition "+typ+" "+map[bool]string{true: "raised", false: "gone"}[want], 2*time.Minute, func() bool {
		has := false
		for _, c := range e.conditions(t) {
			if c.Type == typ {
				has, last = true, c.Message
			}
		}
		return has == want
	})
	if want {
		t.Logf("%s: %s", typ, last)
	}
}

type condition struct{ Type, Message string }

// conditions answers the node's conditions as bcgw status shows them
// (none when it cannot tell).
func (e *systemdEnv) conditions(t *testing.T) []condition {
	t.Helper()
	out, err := exec.Command(e.bin, "status", e.nodeID, "--json", "--data-dir", e.gwDir).Output()
	if err != nil {
		return nil
	}
	var st struct{ Conditions []condition }
	if json.Unmarshal(out, &st) != nil {
		return nil
	}
	return st.Conditions
}
