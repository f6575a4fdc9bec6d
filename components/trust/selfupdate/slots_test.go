package selfupdate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/release"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newSlots(t *testing.T) (*Slots, *clock) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bcd-installed")
	os.WriteFile(bin, []byte("bcd 0.1.0"), 0o755)
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	s := &Slots{Dir: filepath.Join(dir, "slots"), Now: c.now}
	if err := s.Init(bin, "0.1.0", 1); err != nil {
		t.Fatal(err)
	}
	return s, c
}

func build(version string, seq uint64) (release.Manifest, release.Artifact, []byte) {
	bin := []byte("bcd " + version)
	sum := sha256.Sum256(bin)
	a := release.Artifact{Role: "node", Arch: "amd64", Size: int64(len(bin)), SHA256: hex.EncodeToString(sum[:]), URL: "https://r.example/" + version}
	return release.Manifest{Type: release.Type, Version: version, Sequence: seq}, a, bin
}

// running is the binary current names.
func running(t *testing.T, s *Slots) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.Dir, Current))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func upgrade(t *testing.T, s *Slots, version string, seq uint64) (Upgrade, error) {
	t.Helper()
	m, a, bin := build(version, seq)
	return s.Install(bytes.NewReader(bin), m, a)
}

func TestUpgradeConfirmRollback(t *testing.T) {
	s, c := newSlots(t)
	if got := running(t, s); got != "bcd 0.1.0" {
		t.Fatalf("running %q", got)
	}
	u, err := upgrade(t, s, "0.2.0", 2)
	if err != nil || u.To != SlotB || running(t, s) != "bcd 0.2.0" {
		t.Fatalf("swap: %+v %v, running %q", u, err, running(t, s))
	}
	if ok, err := s.Confirm(); !ok || err != nil {
		t.Fatalf("Confirm = %v %v", ok, err)
	}
	r, cur, up, _ := s.Read()
	if r.Floor != 2 || cur != SlotB || up != nil {
		t.Errorf("after confirm: floor %d, current %s, pending %v", r.Floor, cur, up)
	}
	// 0.3.0 never confirms: at the deadline Settle swaps back and
	// records it failed; it is not tried again until cleared.
	if _, err := upgrade(t, s, "0.3.0", 3); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Settle(); v != "" || err != nil || running(t, s) != "bcd 0.3.0" {
		t.Errorf("Settle before the deadline: %q %v", v, err)
	}
	c.t = c.t.Add(ConfirmWindow + time.Second)
	if v, err := s.Settle(); v != "0.3.0" || err != nil || running(t, s) != "bcd 0.2.0" {
		t.Errorf("Settle past the deadline: %q %v, running %q", v, err, running(t, s))
	}
	if _, err := upgrade(t, s, "0.3.0", 3); err == nil || !strings.Contains(err.Error(), "--clear-failed") {
		t.Errorf("a failed release again: %v", err)
	}
	s.ClearFailed()
	if _, err := upgrade(t, s, "0.3.0", 3); err != nil {
		t.Errorf("after clear-failed: %v", err)
	}
	// The crash-loop unit rolls back at once.
	if v, err := s.Rollback(); v != "0.3.0" || err != nil || running(t, s) != "bcd 0.2.0" {
		t.Errorf("Rollback: %q %v", v, err)
	}
	// Below the floor, or at it: refused, nothing swapped.
	for _, tc := range []struct {
		version string
		seq     uint64
	}{{"0.1.1", 1}, {"0.2.1", 2}} {
		if _, err := upgrade(t, s, tc.version, tc.seq); err == nil || !strings.Contains(err.Error(), "is not above the release floor 2") || running(t, s) != "bcd 0.2.0" {
			t.Errorf("release %s at sequence %d: %v", tc.version, tc.seq, err)
		}
	}
}

// TestSettleDropsOnlyConfirmed: an upgrade pending at the floor's own
// sequence (what a swap to a release at the floor left before swaps
// needed a newer one) is not taken as confirmed by Settle: it stays
// pending before its deadline, so the watchdog still swaps it back, and
// is swapped back after. One Confirm recorded is dropped.
func TestSettleDropsOnlyConfirmed(t *testing.T) {
	s, c := newSlots(t) // slot a: 0.1.0 at sequence 1, the floor
	up, err := upgrade(t, s, "0.1.9", 2)
	if err != nil {
		t.Fatal(err)
	}
	// The release had the floor's sequence: records as the old swap
	// wrote them.
	r, _, _, _ := s.Read()
	b := r.Slots[up.To]
	b.Sequence = 1
	r.Slots[up.To] = b
	if err := s.save(r); err != nil {
		t.Fatal(err)
	}
	up.Sequence = 1
	raw, _ := json.Marshal(up)
	if err := os.WriteFile(filepath.Join(s.Dir, UpgradeFile), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Settle(); v != "" || err != nil {
		t.Fatalf("Settle before the deadline: %q %v", v, err)
	}
	if _, _, pending, _ := s.Read(); pending == nil {
		t.Fatal("Settle dropped an upgrade at the floor's sequence that was never confirmed: it runs unconfirmed, the watchdog disarmed")
	}
	c.t = up.Deadline.Add(time.Second)
	if v, err := s.Settle(); v != "0.1.9" || err != nil || running(t, s) != "bcd 0.1.0" {
		t.Errorf("Settle past the deadline: %q %v, running %q", v, err, running(t, s))
	}
	// A confirmed upgrade whose record outlived a kill is dropped, at
	// any time.
	if _, err := upgrade(t, s, "0.2.0", 2); err != nil {
		t.Fatal(err)
	}
	_, _, pending, _ := s.Read()
	r, _, _, _ = s.Read()
	r.Floor, r.Confirmed = 2, pending
	if err := s.save(r); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Settle(); v != "" || err != nil || running(t, s) != "bcd 0.2.0" {
		t.Errorf("Settle of a confirmed upgrade: %q %v", v, err)
	}
	if _, _, pending, _ := s.Read(); pending != nil {
		t.Errorf("a confirmed upgrade is still pending: %+v", pending)
	}
}

func TestDownloadRefuses(t *testing.T) {
	dir := t.TempDir()
	_, a, bin := build("0.2.0", 2)
	for name, body := range map[string][]byte{"short": bin[:3], "long": append(bytes.Clone(bin), 'x'), "other": bytes.Repeat([]byte("y"), len(bin))} {
		if _, err := Download(bytes.NewReader(body), dir, "0.2.0", a); err == nil {
			t.Errorf("%s: staged", name)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("refused downloads left %d files", len(ents))
	}
	if p, err := Download(bytes.NewReader(bin), dir, "0.2.0", a); err != nil || filepath.Base(p) != "bcd-0.2.0" {
		t.Errorf("Download = %s, %v", p, err)
	}
}

// TestInstallRefusesAnotherBinary: bytes that are not the manifest's
// (of another size or hash) never reach a slot.
func TestInstallRefusesAnotherBinary(t *testing.T) {
	s, _ := newSlots(t)
	m, a, bin := build("0.2.0", 2)
	for name, body := range map[string][]byte{"short": bin[:3], "long": append(bytes.Clone(bin), 'x'), "other": bytes.Repeat([]byte("y"), len(bin))} {
		if _, err := s.Install(bytes.NewReader(body), m, a); err == nil {
			t.Errorf("%s: installed", name)
		}
		if running(t, s) != "bcd 0.1.0" {
			t.Fatalf("%s: current moved", name)
		}
	}
}

// TestConfirmRefusesAClaim: a confirmation while current does not name
// the new slot (a node claiming to run what it does not) moves nothing.
func TestConfirmRefusesAClaim(t *testing.T) {
	s, _ := newSlots(t)
	if _, err := upgrade(t, s, "0.2.0", 2); err != nil {
		t.Fatal(err)
	}
	s.point(SlotA)
	if ok, err := s.Confirm(); ok || err == nil {
		t.Errorf("Confirm = %v %v", ok, err)
	}
	if r, _, _, _ := s.Read(); r.Floor != 1 {
		t.Errorf("the floor moved to %d", r.Floor)
	}
}

type crashed struct{ point string }

// TestKillAtEachStep: a kill at each point of a swap, a confirmation and
// a rollback leaves current naming a complete binary whose hash is the
// one recorded for its slot, and the next start (Settle) brings the
// records in line.
func TestKillAtEachStep(t *testing.T) {
	points := []string{"before-copy", "after-copy", "after-upgrade-record", "after-point", "after-floor", "after-point-back"}
	for _, p := range points {
		t.Run(p, func(t *testing.T) {
			s, c := newSlots(t)
			s.crash = func(at string) {
				if at == p {
					panic(crashed{at})
				}
			}
			func() {
				defer func() {
					if r := recover(); r != nil {
						if _, ok := r.(crashed); !ok {
							panic(r)
						}
					}
				}()
				if _, err := upgrade(t, s, "0.2.0", 2); err != nil {
					t.Fatal(err)
				}
				if p == "after-point-back" {
					s.Rollback()
				} else {
					s.Confirm()
				}
			}()
			s.crash = nil
			check := func(when string) {
				r, cur, _, err := s.Read()
				if err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				b, err := os.ReadFile(filepath.Join(s.Dir, cur))
				sum := sha256.Sum256(b)
				if err != nil || hex.EncodeToString(sum[:]) != r.Slots[cur].SHA256 {
					t.Fatalf("%s: current names %s, which is not the binary recorded for it (%v)", when, cur, err)
				}
			}
			check("after the kill")
			c.t = c.t.Add(ConfirmWindow + time.Second)
			if _, err := s.Settle(); err != nil {
				t.Fatal(err)
			}
			check("after Settle")
			if _, _, up, _ := s.Read(); up != nil {
				t.Errorf("an upgrade still pending after Settle past its deadline: %+v", up)
			}
		})
	}
}

func FuzzReadUpgrade(f *testing.F) {
	f.Add([]byte(`{"from":"bcd-a","to":"bcd-b","version":"0.2.0","sequence":2,"deadline":"2026-12-01T12:02:00Z"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		s := &Slots{Dir: dir}
		os.WriteFile(filepath.Join(dir, SlotsFile), []byte(`{"slots":{"bcd-a":{"version":"0.1.0","sequence":1,"sha256":"x"}},"floor":1}`), 0o644)
		os.Symlink(SlotA, filepath.Join(dir, Current))
		os.WriteFile(filepath.Join(dir, UpgradeFile), b, 0o644)
		_, cur, _, _ := s.Read()
		if cur != "" && cur != SlotA {
			t.Fatalf("current %q", cur)
		}
		s.Settle() // must not panic, whatever upgrade.json holds
		if _, cur, _, _ := s.Read(); cur != SlotA && cur != SlotB && cur != "" {
			t.Fatalf("current %q after Settle", cur)
		}
	})
}

// TestSlotsModeWhateverTheUmask: the slots are executed by the agent,
// which under bcd helper is another uid than root who writes them, so the
// binaries are 0755 and the directory 0755 even when the writer's umask
// is 0077 (bcd-helper.service has UMask=0077).
func TestSlotsModeWhateverTheUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	s, _ := newSlots(t)
	if _, err := upgrade(t, s, "0.2.0", 2); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{s.Dir, filepath.Join(s.Dir, SlotA), filepath.Join(s.Dir, SlotB)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s is %v under umask 0077, want 0755 (the agent runs it as another uid)", p, fi.Mode().Perm())
		}
	}
}

// A node that never upgraded itself has no slots: Settle, at every
// start, finds nothing to do and no error (it logged an ERROR on every
// fresh node). A broken slots.json is still an error.
func TestSettleWithoutSlots(t *testing.T) {
	s := &Slots{Dir: filepath.Join(t.TempDir(), "slots"), Now: time.Now}
	if v, err := s.Settle(); v != "" || err != nil {
		t.Fatalf("Settle without slots: %q %v", v, err)
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, SlotsFile), []byte("{broken"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Settle(); err == nil {
		t.Fatal("Settle with a broken slots.json: no error")
	}
}
