package qemutests

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The systemd tier's self-update step (docs/update.md): the installed,
// unprivileged node beside the real bcd-helper.service takes release 2
// (built and signed here, published in the tier's bcgw), restarts into it
// and confirms; release 3, whose binary exits at start, crash-loops
// bcd.service until systemd gives up and bcd-rollback@bcd.service.service
// swaps it back as root and records it failed; release 1 again is
// refused below the release floor.

// sdUpdate is the step's world on the host: bcrelease, the release keys
// and the directory the releases are made in.
type sdUpdate struct {
	e        *systemdEnv
	dir      string
	bcrel    string
	keys     []string
	pins     []string
	gwURL    string
	lastStep time.Time
}

// sdUpdState is `bcd update --json` in the guest.
type sdUpdState struct {
	SlotsDir string `json:"slots_dir"`
	Current  string `json:"current"`
	Floor    uint64 `json:"floor"`
	Slots    map[string]struct {
		Version  string `json:"version"`
		Sequence uint64 `json:"sequence"`
	} `json:"slots"`
	Pending *struct {
		Version string `json:"version"`
	} `json:"pending"`
	Failed []string `json:"failed"`
}

func (s sdUpdState) running() string { return s.Slots[s.Current].Version }

// sdUpdateSectionRe is an [update] section already in config.toml.
var sdUpdateSectionRe = regexp.MustCompile(`\n\[update\]\n([^\[\n][^\n]*\n|\n)*`)

func stepSelfUpdate(t *testing.T, e *systemdEnv) {
	u := &sdUpdate{e: e, dir: t.TempDir(), gwURL: strings.TrimRight(e.doc.Gateway.URL, "/"), lastStep: time.Now()}

	// Release 2 of bcd-node: the package's build with another version.
	u.build(t, "bcrelease", "./cmd/bcrelease", "")
	v2 := u.build(t, "bcd-node-2.0.0", "./roles/node", "2.0.0")
	v1 := filepath.Join(filepath.Dir(e.debs), "bin", "amd64", "bcd-node") // the package's binary, release 1
	if _, err := os.Stat(v1); err != nil {
		t.Fatalf("the package's bcd-node binary: %v", err)
	}
	for i := range 3 {
		k := filepath.Join(u.dir, fmt.Sprintf("release-%d.pem", i))
		u.keys = append(u.keys, k)
		u.pins = append(u.pins, strings.TrimSpace(u.run(t, u.bcrel, "key", "--out", k)))
	}
	u.mark(t, "built release 2 and bcrelease, 3 keys")

	// Pin two of three in the guest's config.toml, read by the node and
	// the helper alike.
	conf := e.g.Must("cat /etc/bcd/config.toml")
	conf = sdUpdateSectionRe.ReplaceAllString(conf, "\n")
	conf += fmt.Sprintf("\n[update]\nrelease_pins = [%q, %q, %q]\nrelease_threshold = 2\n", u.pins[0], u.pins[1], u.pins[2])
	if err := e.g.Put("/etc/bcd/config.toml", []byte(conf), 0o640); err != nil {
		t.Fatal(err)
	}
	e.g.Must("chown root:bcd /etc/bcd/config.toml && systemctl restart bcd-helper.service && systemctl restart bcd.service")
	e.g.WaitActive("bcd-helper.service", 60*time.Second)
	e.g.WaitActive("bcd.service", 60*time.Second)
	e.connected(t)
	before := u.state(t)
	t.Logf("before the upgrade: %+v", before)
	u.mark(t, "pinned 2 of 3 keys, restarted")

	// Release 2 through bcgw release publish and bcgw upgrade --wait.
	u.release(t, "2.0.0", 2, v2)
	b, err := exec.Command(e.bin, "upgrade", e.nodeID, "--version", "2.0.0", "--wait", "--timeout", "5m", "--data-dir", e.gwDir).CombinedOutput()
	out := string(b)
	t.Logf("bcgw upgrade --version 2.0.0 --wait (%v):\n%s", err, tail(out, 1500))
	if err != nil || !strings.Contains(out, e.nodeID+": SUCCEEDED") || !strings.Contains(out, `"version":"2.0.0"`) {
		u.dump(t)
		t.Fatalf("bcgw upgrade to 2.0.0 did not succeed: %v\n%s", err, out)
	}
	s := u.waitState(t, "release 2 confirmed", 2*time.Minute, func(s sdUpdState) bool { return s.Floor == 2 && s.Pending == nil })
	if s.running() != "2.0.0" {
		t.Fatalf("after the upgrade current runs %q, want 2.0.0: %+v", s.running(), s)
	}
	pid := e.mainPID(t, "bcd.service")
	exe := strings.TrimSpace(e.g.Must("readlink /proc/" + pid + "/exe"))
	if want := filepath.Join(s.SlotsDir, s.Current); exe != want {
		t.Errorf("bcd.service's process runs %s, want %s", exe, want)
	}
	if user := strings.TrimSpace(e.g.Must("ps -o user= -p " + pid)); user != "bcd" {
		t.Errorf("after the upgrade bcd.service runs as %s, want bcd", user)
	}
	owners := e.g.Must("stat -c '%n %U:%G %a %F' " + s.SlotsDir + " " + s.SlotsDir + "/*")
	t.Logf("the slots:\n%s", owners)
	for _, l := range strings.Split(strings.TrimSpace(owners), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || !strings.HasPrefix(f[1], "root:") {
			t.Errorf("in the slots: %q, want root's", l)
			continue
		}
		// A symlink's own mode is always 777; what it names is checked.
		if strings.Join(f[3:], " ") != "symbolic link" && strings.ContainsAny(f[2][len(f[2])-2:], "2367") {
			t.Errorf("in the slots: %q, want no one but root able to write it", l)
		}
	}
	if out := e.g.Must("journalctl --no-pager -o cat -u bcd.service -n 200"); !strings.Contains(out, "self-update confirmed") {
		t.Errorf("the journal of bcd.service has no \"self-update confirmed\":\n%s", tail(out, 2000))
	}
	e.ping(t)
	u.mark(t, "release 2 upgraded, confirmed")

	// Release 3 exits at start: systemd restarts it until its start
	// limit, the unit fails, and bcd-rollback@ swaps back.
	bad := filepath.Join(u.dir, "bcd-node-3.0.0")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho 'release 3 exits at start' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	u.release(t, "3.0.0", 3, bad)
	t.Logf("bcgw upgrade --version 3.0.0:\n%s", e.bcgw(t, "upgrade", e.nodeID, "--version", "3.0.0"))
	rb := "bcd-rollback@bcd.service.service"
	for end := time.Now().Add(6 * time.Minute); ; time.Sleep(time.Second) {
		p := e.g.Show(rb, "InvocationID", "ActiveState")
		if p["InvocationID"] != "" && p["ActiveState"] != "activating" {
			break
		}
		if time.Now().After(end) {
			u.dump(t)
			t.Fatalf("%s did not run within 6m: %v", rb, p)
		}
	}
	u.mark(t, "release 3 crash-looped, "+rb+" ran")
	p := e.g.Show(rb, "Result", "ExecMainStatus", "ActiveState")
	t.Logf("%s: %v\njournal:\n%s", rb, p, e.g.Must("journalctl --no-pager -o short-monotonic -u "+rb))
	t.Logf("bcd.service around the crash loop:\n%s", tail(e.g.Must("journalctl --no-pager -o short-monotonic -n 40 -u bcd.service"), 3000))
	if p["Result"] != "success" {
		t.Errorf("%s: %v, want success", rb, p)
	}
	// The crash-loop unit swapped back, not the helper's watchdog at the
	// deadline.
	if j := e.g.Must("journalctl --no-pager -o cat -u " + rb); !strings.Contains(j, "rolled back 3.0.0") {
		t.Errorf("%s did not roll 3.0.0 back:\n%s", rb, j)
	}
	s = u.waitState(t, "release 3 rolled back", 2*time.Minute, func(s sdUpdState) bool {
		return len(s.Failed) == 1 && s.Failed[0] == "3.0.0" && s.running() == "2.0.0" && s.Pending == nil
	})
	if s.Floor != 2 {
		t.Errorf("after the rollback the floor is %d, want 2: %+v", s.Floor, s)
	}
	if hj := e.g.Must("journalctl --no-pager -o cat -u bcd-helper.service -n 100"); strings.Contains(hj, "watchdog") {
		t.Logf("the helper's journal mentions its watchdog:\n%s", tail(hj, 1500))
	}
	e.g.WaitActive("bcd.service", 2*time.Minute)
	if exe := strings.TrimSpace(e.g.Must("readlink /proc/" + e.mainPID(t, "bcd.service") + "/exe")); exe != filepath.Join(s.SlotsDir, s.Current) {
		t.Errorf("after the rollback bcd.service runs %s, want %s", exe, filepath.Join(s.SlotsDir, s.Current))
	}
	e.connected(t)
	e.ping(t)
	u.mark(t, "release 3 recorded failed, release 2 runs, agent.ping")

	// Release 1 again: refused below the floor, nothing swapped.
	u.release(t, "1.0.0", 1, v1)
	b, err = exec.Command(e.bin, "upgrade", e.nodeID, "--version", "1.0.0", "--wait", "--timeout", "5m", "--data-dir", e.gwDir).CombinedOutput()
	t.Logf("bcgw upgrade --version 1.0.0 --wait (%v):\n%s", err, tail(string(b), 1500))
	if err == nil || !strings.Contains(string(b), "below the release floor") {
		t.Errorf("release 1 again: want a refusal \"below the release floor\", got %v:\n%s", err, b)
	}
	if s2 := u.state(t); s2.running() != "2.0.0" || s2.Floor != 2 || s2.Pending != nil {
		t.Errorf("after release 1 was refused: %+v", s2)
	}
	u.mark(t, "release 1 refused below the floor")
}

// mark prints the time since the last sub-step.
func (u *sdUpdate) mark(t *testing.T, what string) {
	t.Logf("self-update: %-55s %6.1fs", what, time.Since(u.lastStep).Seconds())
	u.lastStep = time.Now()
}

// build compiles pkg as the packages do (build/packages.sh), with
// buildinfo.Version set when version is not empty.
func (u *sdUpdate) build(t *testing.T, name, pkg, version string) string {
	t.Helper()
	out := filepath.Join(u.dir, name)
	ldflags := "-s -w"
	if version != "" {
		ldflags += " -X github.com/better-compute/bcd/components/base/buildinfo.Version=" + version
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir = u.e.repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	if name == "bcrelease" {
		u.bcrel = out
	}
	return out
}

func (u *sdUpdate) run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	b, err := exec.Command(bin, args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, stderr)
	}
	return string(b)
}

// release makes, signs (2 of 3) and publishes in bcgw a release of bin
// as the node artifact for amd64, served by the gateway.
func (u *sdUpdate) release(t *testing.T, version string, seq int, bin string) {
	t.Helper()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	doc := filepath.Join(u.dir, "release-"+version+".json")
	u.run(t, u.bcrel, "make", "--version", version, "--sequence", fmt.Sprint(seq), "--expires", "24h",
		"--artifact", "node/amd64="+bin+"@"+u.gwURL+"/releases/"+hex.EncodeToString(sum[:]), "--out", doc)
	for _, k := range u.keys[:2] {
		u.run(t, u.bcrel, "sign", "--key", k, "--in", doc)
	}
	u.e.bcgw(t, "release", "publish", doc, "--artifact", bin)
}

// state is `bcd update --json` in the guest.
func (u *sdUpdate) state(t *testing.T) sdUpdState {
	t.Helper()
	out := u.e.g.Must("bcd update --json --config /etc/bcd/config.toml")
	var s sdUpdState
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("bcd update --json: %v\n%s", err, out)
	}
	return s
}

func (u *sdUpdate) waitState(t *testing.T, what string, within time.Duration, cond func(sdUpdState) bool) sdUpdState {
	t.Helper()
	end := time.Now().Add(within)
	for {
		s := u.state(t)
		if cond(s) {
			return s
		}
		if time.Now().After(end) {
			u.dump(t)
			t.Fatalf("%s: not within %v: %+v", what, within, s)
		}
		time.Sleep(time.Second)
	}
}

// dump logs what the units said, for a step that did not get there.
func (u *sdUpdate) dump(t *testing.T) {
	t.Helper()
	out, _, _ := u.e.g.Run("systemctl status --no-pager -l bcd.service bcd-helper.service 'bcd-rollback@bcd.service.service'; " +
		"journalctl --no-pager -o short-monotonic -n 80 -u bcd.service -u bcd-helper.service -u 'bcd-rollback@bcd.service.service'; " +
		"bcd update --json --config /etc/bcd/config.toml; ls -la /usr/local/lib/bcd")
	t.Logf("the guest:\n%s", out)
}
