package selfupdate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/trust/release"
	"github.com/better-compute/bcd/components/trust/release/releasetest"
)

func newManager(t *testing.T, r *releasetest.Keys) (*Manager, *clock) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bcd-installed")
	os.WriteFile(bin, []byte("bcd 0.1.0"), 0o755)
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	return &Manager{
		Slots: &Slots{Dir: filepath.Join(dir, "slots"), Now: c.now},
		Pins:  r.Pins, Threshold: 2, Role: "node", Arch: "amd64",
		StagingDir: filepath.Join(dir, "staging"), Owner: os.Getuid(),
		Adopt: bin, AdoptVersion: "0.1.0", Now: c.now,
	}, c
}

// rel is release version at seq with one node/amd64 binary.
func rel(version string, seq uint64, expires time.Time) (release.Manifest, []byte) {
	m, a, bin := build(version, seq)
	m.Expires = expires
	m.Artifacts = []release.Artifact{a}
	return m, bin
}

// TestManagerUpgrade: prepare, download, swap and confirm through the
// Installer, from a node with no slots yet (the running binary is
// adopted) to a confirmed release with the floor at its sequence.
func TestManagerUpgrade(t *testing.T) {
	ctx := context.Background()
	r := releasetest.NewKeys(t, 3)
	mgr, c := newManager(t, r)
	m, bin := rel("0.2.0", 2, c.t.Add(time.Hour))
	doc := r.Sign(t, m, 2)
	p, err := mgr.Prepare(ctx, doc)
	if err != nil || p.Staged != "bcd-0.2.0" || p.Artifact.SHA256 != m.Artifacts[0].SHA256 {
		t.Fatalf("Prepare = %+v, %v", p, err)
	}
	if _, err := Download(strings.NewReader(string(bin)), mgr.StagingDir, p.Version, p.Artifact); err != nil {
		t.Fatal(err)
	}
	up, err := mgr.Swap(ctx, doc)
	if err != nil || up.To != SlotB || running(t, mgr.Slots) != "bcd 0.2.0" {
		t.Fatalf("Swap = %+v, %v", up, err)
	}
	if _, err := os.Stat(filepath.Join(mgr.StagingDir, p.Staged)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the staged file is still there: %v", err)
	}
	if ok, err := mgr.Confirm(ctx); !ok || err != nil {
		t.Fatalf("Confirm = %v, %v", ok, err)
	}
	st, _ := mgr.Status(ctx)
	if st.Floor != 2 || st.Current != SlotB || st.Pending != nil || st.Slots[SlotA].Version != "0.1.0" {
		t.Errorf("Status = %+v", st)
	}
}

// TestManagerRefusesAsFinal: each bad release is refused as final with
// its reason, and nothing is swapped.
func TestManagerRefusesAsFinal(t *testing.T) {
	ctx := context.Background()
	r := releasetest.NewKeys(t, 3)
	cases := []struct {
		name string
		make func(t *testing.T, mgr *Manager, now time.Time) []byte
		want string
	}{
		{"below threshold", func(t *testing.T, mgr *Manager, now time.Time) []byte {
			m, _ := rel("0.2.0", 2, now.Add(time.Hour))
			return r.Sign(t, m, 1)
		}, "signed by 1 of the pinned keys; 2 must sign"},
		{"expired", func(t *testing.T, mgr *Manager, now time.Time) []byte {
			m, _ := rel("0.2.0", 2, now.Add(-time.Second))
			return r.Sign(t, m, 2)
		}, "expired"},
		{"below the floor", func(t *testing.T, mgr *Manager, now time.Time) []byte {
			mgr.Slots.Init(mgr.Adopt, mgr.AdoptVersion, 0)
			rec, _, _, _ := mgr.Slots.Read()
			rec.Floor = 5
			mgr.Slots.save(rec)
			m, _ := rel("0.2.0", 2, now.Add(time.Hour))
			return r.Sign(t, m, 2)
		}, "below the release floor 5"},
		{"another architecture", func(t *testing.T, mgr *Manager, now time.Time) []byte {
			m, _ := rel("0.2.0", 2, now.Add(time.Hour))
			m.Artifacts[0].Arch = "arm64"
			return r.Sign(t, m, 2)
		}, "has no node binary for amd64"},
		{"failed before", func(t *testing.T, mgr *Manager, now time.Time) []byte {
			mgr.Slots.Init(mgr.Adopt, mgr.AdoptVersion, 0)
			rec, _, _, _ := mgr.Slots.Read()
			rec.Failed = []string{"0.2.0"}
			mgr.Slots.save(rec)
			m, _ := rel("0.2.0", 2, now.Add(time.Hour))
			return r.Sign(t, m, 2)
		}, "--clear-failed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mgr, c := newManager(t, r)
			doc := tc.make(t, mgr, c.t)
			for _, op := range []string{"prepare", "swap"} {
				var err error
				if op == "prepare" {
					_, err = mgr.Prepare(ctx, doc)
				} else {
					_, err = mgr.Swap(ctx, doc)
				}
				var fe *release.FinalError
				if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s = %v, want a final refusal with %q", op, err, tc.want)
				}
			}
			if running(t, mgr.Slots) != "bcd 0.1.0" {
				t.Errorf("current moved")
			}
		})
	}
}

// TestManagerRefusesAStagedFile: a download of the wrong bytes, and a
// staged file that is a symlink, has two links or another owner, is
// refused and nothing is swapped.
func TestManagerRefusesAStagedFile(t *testing.T) {
	ctx := context.Background()
	r := releasetest.NewKeys(t, 2)
	cases := map[string]func(t *testing.T, mgr *Manager, bin []byte){
		"wrong hash": func(t *testing.T, mgr *Manager, bin []byte) {
			os.MkdirAll(mgr.StagingDir, 0o700)
			os.WriteFile(filepath.Join(mgr.StagingDir, "bcd-0.2.0"), []byte(strings.Repeat("x", len(bin))), 0o600)
		},
		"symlink": func(t *testing.T, mgr *Manager, bin []byte) {
			os.MkdirAll(mgr.StagingDir, 0o700)
			real := filepath.Join(filepath.Dir(mgr.StagingDir), "elsewhere")
			os.WriteFile(real, bin, 0o600)
			os.Symlink(real, filepath.Join(mgr.StagingDir, "bcd-0.2.0"))
		},
		"staging dir a symlink": func(t *testing.T, mgr *Manager, bin []byte) {
			real := filepath.Join(filepath.Dir(mgr.StagingDir), "elsewhere")
			os.MkdirAll(real, 0o700)
			os.WriteFile(filepath.Join(real, "bcd-0.2.0"), bin, 0o600)
			os.Symlink(real, mgr.StagingDir)
		},
		"two links": func(t *testing.T, mgr *Manager, bin []byte) {
			os.MkdirAll(mgr.StagingDir, 0o700)
			p := filepath.Join(mgr.StagingDir, "bcd-0.2.0")
			os.WriteFile(p, bin, 0o600)
			os.Link(p, filepath.Join(mgr.StagingDir, "other"))
		},
		"another owner": func(t *testing.T, mgr *Manager, bin []byte) {
			os.MkdirAll(mgr.StagingDir, 0o700)
			os.WriteFile(filepath.Join(mgr.StagingDir, "bcd-0.2.0"), bin, 0o600)
			mgr.Owner = os.Getuid() + 1
		},
		"a FIFO": func(t *testing.T, mgr *Manager, bin []byte) {
			os.MkdirAll(mgr.StagingDir, 0o700)
			if err := mkfifo(filepath.Join(mgr.StagingDir, "bcd-0.2.0")); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, stage := range cases {
		t.Run(name, func(t *testing.T) {
			mgr, c := newManager(t, r)
			m, bin := rel("0.2.0", 2, c.t.Add(time.Hour))
			stage(t, mgr, bin)
			if _, err := mgr.Swap(ctx, r.Sign(t, m, 2)); err == nil {
				t.Fatal("swapped")
			} else {
				t.Log(err)
			}
			if running(t, mgr.Slots) != "bcd 0.1.0" {
				t.Errorf("current moved")
			}
		})
	}
}

// TestManagerAdoptsOnlyRootsBinary: with RootAdopt, a binary root does
// not own, or that others can write, is not adopted.
func TestManagerAdoptsOnlyRootsBinary(t *testing.T) {
	r := releasetest.NewKeys(t, 2)
	mgr, c := newManager(t, r)
	mgr.RootAdopt = true
	os.Chmod(mgr.Adopt, 0o777)
	m, _ := rel("0.2.0", 2, c.t.Add(time.Hour))
	if _, err := mgr.Prepare(context.Background(), r.Sign(t, m, 2)); err == nil || !strings.Contains(err.Error(), "only root can write") {
		t.Errorf("Prepare = %v", err)
	}
	if _, err := os.Lstat(filepath.Join(mgr.Slots.Dir, Current)); err == nil {
		t.Error("adopted")
	}
}

func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }

// TestManagerFloorFromTheInstalledRelease: the binary adopted before the
// first update brings its release's sequence (the installed package's)
// as the floor, so an older release, signed and unexpired, is refused as
// final from the very first update; a release at the floor's sequence is
// only the one that runs (Prepare answers it, Swap has nothing to do);
// a newer one is taken.
func TestManagerFloorFromTheInstalledRelease(t *testing.T) {
	ctx := context.Background()
	r := releasetest.NewKeys(t, 2)
	mgr, c := newManager(t, r)
	mgr.AdoptSequence = 5
	final := func(what string, err error, want string) {
		t.Helper()
		var fe *release.FinalError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want a final refusal with %q", what, err, want)
		}
	}
	older, bin := rel("0.0.9", 4, c.t.Add(time.Hour))
	doc := r.Sign(t, older, 2)
	_, err := mgr.Prepare(ctx, doc)
	final("prepare of an older release", err, "below the release floor 5")
	if _, err := Download(strings.NewReader(string(bin)), mgr.StagingDir, "0.0.9", older.Artifacts[0]); err != nil {
		t.Fatal(err)
	}
	_, err = mgr.Swap(ctx, doc)
	final("swap to an older release", err, "below the release floor 5")
	st, _ := mgr.Status(ctx)
	if st.Floor != 5 || st.Slots[SlotA].Sequence != 5 || st.Current != SlotA || running(t, mgr.Slots) != "bcd 0.1.0" {
		t.Errorf("after the refusals: %+v", st)
	}
	// The floor's sequence: another binary is refused; the release that
	// runs is prepared (nothing to do) but not swapped to.
	same, bin := rel("0.1.1", 5, c.t.Add(time.Hour))
	_, err = mgr.Prepare(ctx, r.Sign(t, same, 2))
	final("prepare of another release at the floor", err, "is not above the release floor 5 and is not the release that runs (0.1.0)")
	self, bin := rel("0.1.0", 5, c.t.Add(time.Hour))
	if p, err := mgr.Prepare(ctx, r.Sign(t, self, 2)); err != nil || p.Version != "0.1.0" {
		t.Errorf("prepare of the release that runs: %+v %v", p, err)
	}
	if _, err := Download(strings.NewReader(string(bin)), mgr.StagingDir, "0.1.0", self.Artifacts[0]); err != nil {
		t.Fatal(err)
	}
	_, err = mgr.Swap(ctx, r.Sign(t, self, 2))
	final("swap to the release that runs", err, "is not above the release floor 5")
	newer, bin := rel("0.2.0", 6, c.t.Add(time.Hour))
	if _, err := Download(strings.NewReader(string(bin)), mgr.StagingDir, "0.2.0", newer.Artifacts[0]); err != nil {
		t.Fatal(err)
	}
	if up, err := mgr.Swap(ctx, r.Sign(t, newer, 2)); err != nil || up.Sequence != 6 {
		t.Errorf("swap to a newer release: %+v %v", up, err)
	}
}
