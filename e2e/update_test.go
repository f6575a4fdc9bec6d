package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// versioned are node binaries built with another buildinfo.Version
// (fakehw), by version, in the package's bin dir.
var versioned struct {
	mu   sync.Mutex
	done map[string]error
}

// buildVersion builds bcd-node-VERSION (and bcrelease once) into l.bin.
func buildVersion(t testing.TB, l *lab, version string) string {
	t.Helper()
	return buildRoleVersion(t, l, "node", version)
}

// buildRoleVersion builds bcd-ROLE-VERSION (fakehw) into l.bin.
func buildRoleVersion(t testing.TB, l *lab, role, version string) string {
	t.Helper()
	versioned.mu.Lock()
	defer versioned.mu.Unlock()
	if versioned.done == nil {
		versioned.done = map[string]error{}
	}
	name := "bcd-" + role + "-" + version
	if err, ok := versioned.done[name]; ok {
		if err != nil {
			t.Fatal(err)
		}
		return name
	}
	if _, ok := versioned.done["bcrelease"]; !ok {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(l.bin, "bcrelease"), "./cmd/bcrelease")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build bcrelease: %v\n%s", err, out)
		}
		versioned.done["bcrelease"] = nil
	}
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "fakehw",
		"-ldflags", "-X github.com/better-compute/bcd/components/base/buildinfo.Version="+version,
		"-o", filepath.Join(l.bin, name), "./roles/"+role)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("go build %s: %v\n%s", name, err, out)
	}
	versioned.done[name] = err
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// updateSectionRe is the [update] section bcd join wrote.
var updateSectionRe = regexp.MustCompile(`\n\[update\]\n([^\[\n][^\n]*\n|\n)*`)

// upd is one self-update test's world: a gateway, a joined node whose
// config pins two of three release keys (threshold 2), and a loopback
// HTTP server for the release binaries.
type upd struct {
	l       *lab
	role    string
	g       *gw
	cfg, id string
	keys    []string
	pins    []string
	serve   string // the served directory
	url     string
	entry   string // the entrypoint binary (release 1)
	env     []string
	node    *proc
}

func newUpd(t testing.TB, window string) *upd { return newUpdRole(t, window, "node") }

// newUpdRole is newUpd for a node or a site agent.
func newUpdRole(t testing.TB, window, role string) *upd {
	l := newLab(t)
	u := &upd{l: l, role: role, entry: buildRoleVersion(t, l, role, "1.0.0"), serve: filepath.Join(l.root, "releases")}
	os.MkdirAll(u.serve, 0o755)
	srv := httptest.NewServer(http.FileServer(http.Dir(u.serve)))
	t.Cleanup(srv.Close)
	u.url = srv.URL
	u.g = l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	if role == "site" {
		u.cfg, u.id = l.joinNode(u.g, "n1", l.token(u.g, "--role", "site", "--site", "s1"), "site")
	} else {
		u.cfg, u.id = l.joinNode(u.g, "n1", l.token(u.g), "node")
	}
	for i := range 3 {
		k := filepath.Join(l.root, fmt.Sprintf("release-%d.pem", i))
		code, out, errOut := l.run("", nil, "bcrelease", "key", "--out", k)
		if code != 0 {
			t.Fatalf("bcrelease key: %s", errOut)
		}
		u.keys = append(u.keys, k)
		u.pins = append(u.pins, strings.TrimSpace(out))
	}
	b, err := os.ReadFile(u.cfg)
	if err != nil {
		t.Fatal(err)
	}
	sec := fmt.Sprintf("[update]\nrelease_pins = [%q, %q, %q]\nrelease_threshold = 2\n", u.pins[0], u.pins[1], u.pins[2])
	b = append(updateSectionRe.ReplaceAll(b, []byte("\n")), "\n"+sec...)
	if err := os.WriteFile(u.cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	u.env = []string{"BCD_UPDATE_WINDOW=" + window}
	return u
}

// start starts the entrypoint (bcd node), as systemd would.
func (u *upd) start(extraEnv ...string) {
	u.node = u.l.startEnv(append(append([]string{}, u.env...), extraEnv...), u.entry, u.role, "--config", u.cfg)
}

// rel makes release version at seq of bin (a file path) for arch,
// expiring at expires, signed by the first `signers` keys, its binary
// served at u.url; serve, when set, replaces the served bytes.
func (u *upd) rel(t testing.TB, version string, seq int, bin, arch, expires string, signers int, serve []byte) []byte {
	t.Helper()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	name := "bcd-" + u.role + "-" + version + "-" + arch
	if serve == nil {
		serve = b
	}
	if err := os.WriteFile(filepath.Join(u.serve, name), serve, 0o644); err != nil {
		t.Fatal(err)
	}
	return u.relAt(t, version, seq, bin, arch, expires, signers, u.url+"/"+name)
}

// relAt makes release version with its artifact at url.
func (u *upd) relAt(t testing.TB, version string, seq int, bin, arch, expires string, signers int, url string) []byte {
	t.Helper()
	out := filepath.Join(u.l.root, "release-"+version+".json")
	os.Remove(out)
	code, _, errOut := u.l.run("", nil, "bcrelease", "make", "--version", version, "--sequence", fmt.Sprint(seq), "--expires", expires,
		"--artifact", u.role+"/"+arch+"="+bin+"@"+url, "--out", out)
	if code != 0 {
		t.Fatalf("bcrelease make: %s", errOut)
	}
	for _, k := range u.keys[:signers] {
		if code, _, errOut := u.l.run("", nil, "bcrelease", "sign", "--key", k, "--in", out); code != 0 {
			t.Fatalf("bcrelease sign: %s", errOut)
		}
	}
	doc, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// upgrade sends daemon.upgrade with doc and waits for its result.
func (u *upd) upgrade(t testing.TB, doc []byte) (int, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]json.RawMessage{"release": doc})
	code, out, errOut := u.l.run("", nil, "bcgw", "run", u.id, "daemon.upgrade", "--body", string(body), "--wait", "--timeout", "3m", "--data-dir", u.g.dataDir)
	return code, out + errOut
}

type updState struct {
	Initialized bool   `json:"initialized"`
	Current     string `json:"current"`
	Floor       uint64 `json:"floor"`
	Slots       map[string]struct {
		Version  string `json:"version"`
		Sequence uint64 `json:"sequence"`
	} `json:"slots"`
	Pending *struct {
		Version string `json:"version"`
	} `json:"pending"`
	Failed []string `json:"failed"`
}

// running is the version current names.
func (s updState) running() string { return s.Slots[s.Current].Version }

// state is `bcd update --json`.
func (u *upd) state(t testing.TB) updState {
	t.Helper()
	code, out, errOut := u.l.run("", nil, u.entry, "update", "--json", "--config", u.cfg)
	if code != 0 {
		t.Fatalf("bcd update --json: exit %d: %s", code, errOut)
	}
	var s updState
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("bcd update --json: %v\n%s", err, out)
	}
	return s
}

// waitState waits until cond holds for `bcd update --json`.
func (u *upd) waitState(t testing.TB, what string, cond func(updState) bool) updState {
	t.Helper()
	end := time.Now().Add(90 * time.Second)
	for time.Now().Before(end) {
		if s := u.state(t); cond(s) {
			return s
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not within 90s: %+v", what, u.state(t))
	return updState{}
}

// TestSelfUpdate: a node on release 1 takes release 2 (built and signed
// in the test) through daemon.upgrade: it swaps, re-executes into the
// new slot, the command SUCCEEDS from the new binary and its first
// Welcome confirms (floor 2). Releases below the threshold, expired,
// with a wrong hash, for another architecture, or below the floor
// (release 1 again) fail as final with their reason, and nothing is
// swapped. A release 3 whose binary exits at start is rolled back at
// its deadline by the entrypoint's Settle (restarted as systemd's
// Restart= would) and recorded failed; the command reports it.
func TestSelfUpdate(t *testing.T) {
	u := newUpd(t, "8s")
	l := u.l
	v2 := filepath.Join(l.bin, buildVersion(t, l, "2.0.0"))
	v1 := filepath.Join(l.bin, u.entry)
	arch := runtime.GOARCH
	u.start()
	l.waitNode(u.g, u.id, "connected", func(n nodeView) bool { return n.Connected })

	// Release 2 is published in the gateway, which serves its binary.
	b2, _ := os.ReadFile(v2)
	sum := sha256.Sum256(b2)
	gwURL := "https://" + u.g.addr + "/releases/" + hex.EncodeToString(sum[:])
	doc2 := u.relAt(t, "2.0.0", 2, v2, arch, "1h", 2, gwURL)
	l.bcgw(u.g, "release", "publish", filepath.Join(l.root, "release-2.0.0.json"), "--artifact", v2)
	code, out, errOut := l.run("", nil, "bcgw", "upgrade", u.id, "--version", "2.0.0", "--wait", "--data-dir", u.g.dataDir)
	if code != 0 || !strings.Contains(out, u.id+": SUCCEEDED") || !strings.Contains(out, `"version":"2.0.0"`) {
		t.Fatalf("bcgw upgrade to 2.0.0: exit %d: %s %s", code, out, errOut)
	}
	_ = doc2
	if st := l.bcgw(u.g, "status", u.id); !regexp.MustCompile(`(?m)^upgrade +to 2\.0\.0 \(cmd_\w+\): SUCCEEDED`).MatchString(st) {
		t.Errorf("bcgw status shows no upgrade:\n%s", st)
	}
	s := u.waitState(t, "confirmed", func(s updState) bool { return s.Floor == 2 && s.Pending == nil })
	if s.running() != "2.0.0" || s.Slots["bcd-a"].Version != "1.0.0" {
		t.Fatalf("after the upgrade: %+v", s)
	}
	u.node.waitLog(t, "self-update confirmed", 10*time.Second)

	// Refusals: final, with the reason, nothing swapped.
	wrong, _ := os.ReadFile(v2)
	wrong = append([]byte{}, wrong...)
	wrong[len(wrong)/2] ^= 0xff
	other := "arm64"
	if arch == "arm64" {
		other = "amd64"
	}
	for _, c := range []struct {
		name string
		doc  func() []byte
		want string
	}{
		{"below threshold", func() []byte { return u.rel(t, "2.1.0", 3, v2, arch, "1h", 1, nil) }, "signed by 1 of the pinned keys; 2 must sign"},
		{"expired", func() []byte { return u.rel(t, "2.1.1", 3, v2, arch, "2020-01-01T00:00:00Z", 2, nil) }, "expired"},
		{"wrong hash", func() []byte { return u.rel(t, "2.1.2", 3, v2, arch, "1h", 2, wrong) }, "sha256"},
		{"another architecture", func() []byte { return u.rel(t, "2.1.3", 3, v2, other, "1h", 2, nil) }, arch},
		{"below the floor", func() []byte { return u.rel(t, "1.0.0", 1, v1, arch, "1h", 2, nil) }, "below the release floor"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out := u.upgrade(t, c.doc())
			if code == 0 || !strings.Contains(out, "FAILED") || !strings.Contains(out, "release manifest refused") || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, want FAILED with %q: %s", code, c.want, out)
			}
			if s := u.state(t); s.running() != "2.0.0" || s.Pending != nil || s.Floor != 2 {
				t.Fatalf("swapped: %+v", s)
			}
		})
	}
	if ents, _ := os.ReadDir(filepath.Join(l.root, "n1", "data", "staging")); len(ents) != 0 {
		t.Errorf("staged files left: %v", ents)
	}

	// Release 3 exits at start: rolled back at its deadline.
	bad := filepath.Join(l.root, "bcd-bad")
	os.WriteFile(bad, []byte("#!/bin/sh\necho 'release 3 exits at start' >&2\nexit 3\n"), 0o755)
	doc3 := u.rel(t, "3.0.0", 3, bad, arch, "1h", 2, nil)
	type result struct {
		code int
		out  string
	}
	done := make(chan result, 1)
	go func() { c, o := u.upgrade(t, doc3); done <- result{c, o} }()
	starts := 0
	for end := time.Now().Add(90 * time.Second); time.Now().Before(end); {
		select {
		case <-u.node.done:
			// systemd's Restart=: start the entrypoint again.
			starts++
			time.Sleep(500 * time.Millisecond)
			u.start()
			continue
		case <-time.After(200 * time.Millisecond):
		}
		if s := u.state(t); len(s.Failed) == 1 && s.running() == "2.0.0" {
			break
		}
	}
	s = u.waitState(t, "rolled back", func(s updState) bool { return len(s.Failed) == 1 && s.Failed[0] == "3.0.0" && s.running() == "2.0.0" })
	if s.Floor != 2 || s.Pending != nil || starts == 0 {
		t.Fatalf("after the rollback (%d restarts): %+v", starts, s)
	}
	// The command's result, from the rolled-back binary.
	var res result
	select {
	case res = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("daemon.upgrade to 3.0.0: no result")
	}
	if res.code == 0 || !strings.Contains(res.out, "FAILED") || !strings.Contains(res.out, "release 3.0.0 did not take") {
		t.Fatalf("daemon.upgrade to 3.0.0: exit %d: %s", res.code, res.out)
	}
	// Tried again: refused as failed before, nothing swapped.
	code, out = u.upgrade(t, doc3)
	if code == 0 || !strings.Contains(out, "failed before") {
		t.Fatalf("release 3 again: exit %d: %s", code, out)
	}

	// The daemon section: release 4 by its URL, through the desired state.
	v4 := filepath.Join(l.bin, buildVersion(t, l, "4.0.0"))
	doc4 := u.rel(t, "4.0.0", 4, v4, arch, "1h", 2, nil)
	os.WriteFile(filepath.Join(u.serve, "release-4.0.0.json"), doc4, 0o644)
	l.spec(u.g, "set", u.id, fmt.Sprintf(`{"daemon":{"version":"4.0.0","release_url":%q}}`, u.url+"/release-4.0.0.json"))
	s = u.waitState(t, "release 4 through the daemon section", func(s updState) bool { return s.Floor == 4 && s.Pending == nil })
	if s.running() != "4.0.0" {
		t.Fatalf("after the daemon section: %+v", s)
	}
}

// slotsIntact checks that current names a complete binary: its SHA-256
// is the one slots.json records for its slot.
func (u *upd) slotsIntact(t testing.TB, when string) updState {
	t.Helper()
	dir := filepath.Join(u.l.root, "n1", "data", "bin")
	var rec struct {
		Slots map[string]struct {
			SHA256 string `json:"sha256"`
		} `json:"slots"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "slots.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		t.Fatalf("%s: slots.json: %v", when, err)
	}
	cur, err := os.Readlink(filepath.Join(dir, "current"))
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	bin, err := os.ReadFile(filepath.Join(dir, cur))
	if err != nil {
		t.Fatalf("%s: current names %s: %v", when, cur, err)
	}
	sum := sha256.Sum256(bin)
	if hex.EncodeToString(sum[:]) != rec.Slots[cur].SHA256 {
		t.Fatalf("%s: current names %s, whose binary is not the one recorded", when, cur)
	}
	return u.state(t)
}

// TestSelfUpdateKillAtEachStep: the node is killed with SIGKILL at each
// step of a swap (before and after the copy, after the upgrade record,
// after current moved, after the floor rose on confirmation, after
// current moved back on a rollback); each time current names a complete
// binary, the entrypoint started again runs the old release or the new
// one and reaches the gateway, and the slots settle (confirmed, or
// dropped, or recorded failed).
func TestSelfUpdateKillAtEachStep(t *testing.T) {
	u := newUpd(t, "5s")
	l := u.l
	arch := runtime.GOARCH
	bad := filepath.Join(l.root, "bcd-bad")
	os.WriteFile(bad, []byte("#!/bin/sh\nexit 3\n"), 0o755)
	running := "1.0.0"
	for i, point := range []string{"before-copy", "after-copy", "after-upgrade-record", "after-point", "after-floor", "after-point-back"} {
		t.Run(point, func(t *testing.T) {
			version := fmt.Sprintf("2.0.%d", i)
			bin := bad
			if point != "after-point-back" {
				bin = filepath.Join(l.bin, buildVersion(t, l, version))
			}
			doc := u.rel(t, version, i+2, bin, arch, "1h", 2, nil)
			u.start("BCD_UPDATE_KILL_AT=" + point)
			u.node.waitLog(t, "session established", 30*time.Second)
			body, _ := json.Marshal(map[string]json.RawMessage{"release": doc})
			l.bcgw(u.g, "run", u.id, "daemon.upgrade", "--body", string(body))
			// Wait for the kill; a release that exits at start is
			// started again (systemd's Restart=) until the rollback
			// is killed.
			end := time.Now().Add(60 * time.Second)
			for {
				select {
				case <-u.node.done:
				case <-time.After(time.Until(end)):
					t.Fatalf("not killed at %s within 60s", point)
				}
				if u.node.cmd.ProcessState.ExitCode() == -1 {
					break
				}
				time.Sleep(300 * time.Millisecond)
				u.start("BCD_UPDATE_KILL_AT=" + point)
			}
			s := u.slotsIntact(t, "after the kill")
			if r := s.running(); r != running && r != version {
				t.Fatalf("after the kill current runs %s, neither %s nor %s", r, running, version)
			}
			// Started again without the kill: it reaches the gateway on
			// the old release or the new one, and the slots settle.
			u.start()
			m := u.node.waitLog(t, "session established", 60*time.Second)
			_ = m
			s = u.waitState(t, "settled", func(s updState) bool { return s.Pending == nil })
			u.slotsIntact(t, "settled")
			switch {
			case point == "after-point-back":
				if s.running() != running || len(s.Failed) != 1 || s.Failed[0] != version {
					t.Fatalf("after a killed rollback: %+v", s)
				}
			case s.running() == version:
				if s.Floor != uint64(i+2) {
					t.Fatalf("runs %s unconfirmed: %+v", version, s)
				}
			case s.running() != running:
				t.Fatalf("runs %s, neither %s nor %s", s.running(), running, version)
			}
			running = s.running()
			u.node.signal(syscall.SIGTERM)
			u.node.wait(t, 30*time.Second)
		})
	}
}

// TestSelfUpdateSite: a site agent on release 1 takes release 2 through
// bcgw upgrade, re-executes into it and confirms.
func TestSelfUpdateSite(t *testing.T) {
	u := newUpdRole(t, "30s", "site")
	l := u.l
	v2 := filepath.Join(l.bin, buildRoleVersion(t, l, "site", "2.0.0"))
	u.start()
	u.node.waitLog(t, "session established", 30*time.Second)
	b2, _ := os.ReadFile(v2)
	sum := sha256.Sum256(b2)
	u.relAt(t, "2.0.0", 2, v2, runtime.GOARCH, "1h", 2, "https://"+u.g.addr+"/releases/"+hex.EncodeToString(sum[:]))
	l.bcgw(u.g, "release", "publish", filepath.Join(l.root, "release-2.0.0.json"), "--artifact", v2)
	code, out, errOut := l.run("", nil, "bcgw", "upgrade", u.id, "--version", "2.0.0", "--wait", "--data-dir", u.g.dataDir)
	if code != 0 || !strings.Contains(out, u.id+": SUCCEEDED") {
		t.Fatalf("bcgw upgrade of the site to 2.0.0: exit %d: %s %s", code, out, errOut)
	}
	s := u.waitState(t, "confirmed", func(s updState) bool { return s.Floor == 2 && s.Pending == nil })
	if s.running() != "2.0.0" {
		t.Fatalf("after the upgrade: %+v", s)
	}
}

// BenchmarkUpgrade: the time from daemon.upgrade sent (bcgw run) to the
// new release confirmed on the node (its "self-update confirmed" log
// line), next to a plain restart of the same node in the same run
// (SIGTERM to the session established again); medians of 3 each.
func BenchmarkUpgrade(b *testing.B) {
	u := newUpd(b, "120s")
	l := u.l
	const n = 3
	var bins []string
	for i := range n {
		bins = append(bins, filepath.Join(l.bin, buildVersion(b, l, fmt.Sprintf("2.0.%d", i))))
	}
	u.start()
	u.node.waitLog(b, "session established", 30*time.Second)
	var upgrades, restarts []time.Duration
	for range b.N {
		for i := range n {
			doc := u.rel(b, fmt.Sprintf("2.0.%d", i), len(upgrades)+2, bins[i], runtime.GOARCH, "1h", 2, nil)
			body, _ := json.Marshal(map[string]json.RawMessage{"release": doc})
			start := time.Now()
			l.bcgw(u.g, "run", u.id, "daemon.upgrade", "--body", string(body))
			u.node.waitLog(b, "self-update confirmed", 60*time.Second)
			upgrades = append(upgrades, time.Since(start))

			start = time.Now()
			u.node.signal(syscall.SIGTERM)
			u.node.wait(b, 30*time.Second)
			u.start()
			u.node.waitLog(b, "session established", 30*time.Second)
			restarts = append(restarts, time.Since(start))
		}
	}
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(med(upgrades), "upgrade-ms")
	b.ReportMetric(med(restarts), "restart-ms")
}
