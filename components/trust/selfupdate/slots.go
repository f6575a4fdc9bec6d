// Package selfupdate keeps bcd's A/B binary slots for self-update: two slots
// (bcd-a, bcd-b) in a slots directory, a `current` symlink naming the one
// that runs, and the records that say what each holds and what is in
// flight. A release is staged (downloaded with its size and SHA-256
// checked while it is written), installed into the slot not running
// (hashed again as it is copied, so what is checked is what runs), and
// swapped in with upgrade.json giving a deadline; the new binary confirms
// on its first Welcome, which raises the release floor, or the swap is
// undone at the deadline (Settle) or by the crash-loop unit (Rollback),
// and the version is recorded failed until ClearFailed. Each step ends
// in an atomic rename, so at every instant `current` names a complete
// binary: a kill at any point leaves a node that starts, old or new,
// never neither. docs/update.md describes the design; the release
// manifests are components/trust/release. It sits in the trust domain so
// that both the node (components/agent/update) and bcd helper (the
// update.* operations) run the same Manager.
package selfupdate

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/trust/release"
)

// The slots directory's names.
const (
	SlotA       = "bcd-a"
	SlotB       = "bcd-b"
	Current     = "current"
	SlotsFile   = "slots.json"
	UpgradeFile = "upgrade.json"
	StagingDir  = "staging"
)

// ConfirmWindow is how long a new binary has to confirm.
const ConfirmWindow = 120 * time.Second

// Slot is what one slot holds.
type Slot struct {
	Version  string `json:"version"`
	Sequence uint64 `json:"sequence"`
	SHA256   string `json:"sha256"`
}

// Record is slots.json: each slot's binary, the release floor (the
// sequence of the last confirmed release, or of the adopted binary's
// release before any), the versions that failed, and the last upgrade
// Confirm kept (so Settle drops only an upgrade that was confirmed).
type Record struct {
	Slots     map[string]Slot `json:"slots"`
	Floor     uint64          `json:"floor"`
	Failed    []string        `json:"failed,omitempty"`
	Confirmed *Upgrade        `json:"confirmed,omitempty"`
}

// Upgrade is upgrade.json: a swap waiting for its confirmation.
type Upgrade struct {
	From     string    `json:"from"`
	To       string    `json:"to"`
	Version  string    `json:"version"`
	Sequence uint64    `json:"sequence"`
	Deadline time.Time `json:"deadline"`
}

// Slots is a slots directory.
type Slots struct {
	Dir string
	Now func() time.Time
	// Window is how long a new binary has to confirm (ConfirmWindow
	// when zero; fakehw end-to-end tests shorten it).
	Window time.Duration
	// crash, when set, is called at each step's named point (tests kill
	// the process there).
	crash func(point string)
}

func (s *Slots) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Slots) at(point string) {
	if s.crash != nil {
		s.crash(point)
	}
}

func (s *Slots) path(name string) string { return filepath.Join(s.Dir, name) }

// Init adopts bin (the binary that runs now, at version and sequence) as
// slot A when the directory has no slots yet, with the release floor at
// that sequence (the installed package's release: nothing older is taken
// from then on). It does nothing to slots that exist.
func (s *Slots) Init(bin, version string, sequence uint64) error {
	if _, err := os.Lstat(s.path(Current)); err == nil {
		return nil
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	// Whatever the umask (bcd-helper.service's is 0077): under bcd helper
	// the agent that runs the slots is another uid than their writer.
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		return err
	}
	in, err := os.Open(bin)
	if err != nil {
		return fmt.Errorf("adopting %s into %s: %w", bin, SlotA, err)
	}
	defer in.Close()
	sum, err := copyHashed(in, s.path(SlotA), -1, "")
	if err != nil {
		return fmt.Errorf("adopting %s into %s: %w", bin, SlotA, err)
	}
	if err := s.save(Record{Slots: map[string]Slot{SlotA: {Version: version, Sequence: sequence, SHA256: sum}}, Floor: sequence}); err != nil {
		return err
	}
	return s.point(SlotA)
}

// Read returns slots.json, the slot current names, and the pending
// upgrade (nil when none).
func (s *Slots) Read() (Record, string, *Upgrade, error) {
	var r Record
	b, err := os.ReadFile(s.path(SlotsFile))
	if err != nil {
		return r, "", nil, fmt.Errorf("reading %s: %w", SlotsFile, err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, "", nil, fmt.Errorf("%s: %w", SlotsFile, err)
	}
	cur, err := os.Readlink(s.path(Current))
	if err != nil {
		return r, "", nil, err
	}
	if cur != SlotA && cur != SlotB {
		return r, "", nil, fmt.Errorf("%s points at %q, not %s or %s", Current, cur, SlotA, SlotB)
	}
	var up *Upgrade
	if b, err := os.ReadFile(s.path(UpgradeFile)); err == nil {
		up = &Upgrade{}
		if err := json.Unmarshal(b, up); err != nil {
			return r, cur, nil, fmt.Errorf("%s: %w", UpgradeFile, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return r, cur, nil, err
	}
	return r, cur, up, nil
}

func (s *Slots) save(r Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(s.path(SlotsFile), b, 0o644)
}

// point makes current name slot, atomically (a new link renamed over
// the old).
func (s *Slots) point(slot string) error {
	tmp := s.path(".current.tmp")
	os.Remove(tmp)
	if err := os.Symlink(slot, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.path(Current)); err != nil {
		return err
	}
	atomicfile.SyncDir(s.Dir)
	return nil
}

func other(slot string) string {
	if slot == SlotA {
		return SlotB
	}
	return SlotA
}

// StagedName is the file a release's download is written to, in the
// staging directory (the node's data_dir/staging).
func StagedName(version string) string { return "bcd-" + version }

// Download writes release version's binary from r into dir as
// StagedName(version), checking its size and SHA-256 while it writes; a
// short, long or different download leaves nothing staged.
func Download(r io.Reader, dir, version string, a release.Artifact) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	staged := filepath.Join(dir, StagedName(version))
	part := staged + ".part"
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, a.Size+1))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	sum := hex.EncodeToString(h.Sum(nil))
	switch {
	case err != nil:
	case n != a.Size:
		err = fmt.Errorf("the download is %d bytes, the manifest says %d", min(n, a.Size+1), a.Size)
	case sum != a.SHA256:
		err = fmt.Errorf("the download's sha256 is %s, the manifest says %s", sum, a.SHA256)
	}
	if err != nil {
		os.Remove(part)
		return "", fmt.Errorf("downloading release %s: %w", version, err)
	}
	if err := os.Rename(part, staged); err != nil {
		return "", err
	}
	return staged, nil
}

// Install copies release m's binary (artifact a) from src into the slot
// that does not run, hashing what it writes, and points current at it,
// with upgrade.json giving the new binary ConfirmWindow to confirm. A
// release that is not above the floor (a swap needs a newer release than
// the last confirmed one), or one recorded failed, is refused as final;
// so is an install while another waits for its confirmation.
func (s *Slots) Install(src io.Reader, m release.Manifest, a release.Artifact) (Upgrade, error) {
	r, cur, up, err := s.Read()
	if err != nil {
		return Upgrade{}, err
	}
	switch {
	case up != nil:
		return Upgrade{}, fmt.Errorf("an upgrade to %s waits for its confirmation", up.Version)
	case m.Sequence <= r.Floor:
		return Upgrade{}, &release.FinalError{Err: fmt.Errorf("release %s (sequence %d) is not above the release floor %d: a swap needs a newer release than the last confirmed", m.Version, m.Sequence, r.Floor)}
	case slices.Contains(r.Failed, m.Version):
		return Upgrade{}, &release.FinalError{Err: fmt.Errorf("release %s failed before: it is not tried again until bcd update --clear-failed", m.Version)}
	}
	to := other(cur)
	s.at("before-copy")
	sum, err := copyHashed(src, s.path(to), a.Size, a.SHA256)
	if err != nil {
		return Upgrade{}, fmt.Errorf("installing into %s: %w", to, err)
	}
	s.at("after-copy")
	r.Slots[to] = Slot{Version: m.Version, Sequence: m.Sequence, SHA256: sum}
	if err := s.save(r); err != nil {
		return Upgrade{}, err
	}
	u := Upgrade{From: cur, To: to, Version: m.Version, Sequence: m.Sequence, Deadline: s.now().Add(cmp.Or(s.Window, ConfirmWindow)).UTC()}
	b, _ := json.MarshalIndent(u, "", "  ")
	if err := atomicfile.Write(s.path(UpgradeFile), b, 0o644); err != nil {
		return Upgrade{}, err
	}
	s.at("after-upgrade-record")
	if err := s.point(to); err != nil {
		return Upgrade{}, err
	}
	s.at("after-point")
	return u, nil
}

// Confirm is the new binary's first Welcome: the pending upgrade is
// kept, the floor rises to its sequence. It does nothing without a
// pending upgrade, and refuses one current does not point at (a node
// that claims to run what it does not).
func (s *Slots) Confirm() (bool, error) {
	r, cur, up, err := s.Read()
	if err != nil || up == nil {
		return false, err
	}
	if cur != up.To {
		return false, fmt.Errorf("the pending upgrade is to %s but %s names %s", up.To, Current, cur)
	}
	r.Floor = max(r.Floor, up.Sequence)
	r.Confirmed = up
	if err := s.save(r); err != nil {
		return false, err
	}
	s.at("after-floor")
	if err := os.Remove(s.path(UpgradeFile)); err != nil {
		return false, err
	}
	atomicfile.SyncDir(s.Dir)
	return true, nil
}

// Settle runs at start: a pending upgrade past its deadline is undone
// (current back to the slot it came from) and its version recorded
// failed; one whose swap never happened (a kill before current moved),
// or that Confirm recorded confirmed (a kill before it removed
// upgrade.json), is dropped. A floor at the upgrade's sequence alone
// does not drop it: only Confirm's record does. It reports the version
// it rolled back, "" when none. Without slots (no slots.json or current
// yet) it does nothing.
func (s *Slots) Settle() (string, error) {
	r, cur, up, err := s.Read()
	if errors.Is(err, fs.ErrNotExist) {
		// No slots yet (a node that never upgraded itself): nothing to
		// settle, and nothing wrong.
		return "", nil
	}
	if err != nil || up == nil {
		return "", err
	}
	// Dropped: a swap that never happened (current still names the old
	// slot), or one already confirmed (a kill between the floor and the
	// record's removal).
	if cur == up.From || cur == up.To && r.Floor >= up.Sequence && confirmed(r, up) {
		if err := os.Remove(s.path(UpgradeFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		return "", nil
	}
	if s.now().Before(up.Deadline) {
		return "", nil
	}
	return up.Version, s.undo(up)
}

// confirmed reports whether r records up as confirmed: Confirm's record
// of it, or (slots.json of a release before that record) a slot to go
// back to that is already below the floor, which only a confirmation
// raised past it.
func confirmed(r Record, up *Upgrade) bool {
	if c := r.Confirmed; c != nil {
		return c.From == up.From && c.To == up.To && c.Version == up.Version && c.Sequence == up.Sequence && c.Deadline.Equal(up.Deadline)
	}
	back, ok := r.Slots[up.From]
	return ok && back.Sequence < r.Floor
}

// Rollback undoes a pending upgrade now (the crash-loop unit: the new
// binary does not stay up).
func (s *Slots) Rollback() (string, error) {
	_, _, up, err := s.Read()
	if err != nil || up == nil {
		return "", err
	}
	return up.Version, s.undo(up)
}

func (s *Slots) undo(up *Upgrade) error {
	r, _, _, err := s.Read()
	if err != nil {
		return err
	}
	if back, ok := r.Slots[up.From]; ok && back.Sequence < r.Floor {
		return fmt.Errorf("the slot to go back to (%s, %s) is below the release floor %d", up.From, back.Version, r.Floor)
	}
	// Recorded failed before current moves back: a kill after the move
	// leaves current at From, which the next Settle takes as a swap that
	// never happened, so the record must already say it failed.
	if !slices.Contains(r.Failed, up.Version) {
		r.Failed = append(r.Failed, up.Version)
	}
	if err := s.save(r); err != nil {
		return err
	}
	if err := s.point(up.From); err != nil {
		return err
	}
	s.at("after-point-back")
	if err := os.Remove(s.path(UpgradeFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	atomicfile.SyncDir(s.Dir)
	return nil
}

// ClearFailed forgets the failed versions (bcd update --clear-failed).
func (s *Slots) ClearFailed() error {
	r, _, _, err := s.Read()
	if err != nil {
		return err
	}
	r.Failed = nil
	return s.save(r)
}

// copyHashed copies in to dst through a temporary file renamed into
// place, hashing what it writes; with size >= 0 and want set, a copy of
// another size or hash is refused and dst is left as it was.
func copyHashed(in io.Reader, dst string, size int64, want string) (string, error) {
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	// 0755 whatever the umask: the agent runs the slot as another uid
	// than root's helper that writes it.
	if err := out.Chmod(0o755); err != nil {
		out.Close()
		return "", err
	}
	h := sha256.New()
	limit := int64(1 << 30)
	if size >= 0 {
		limit = size + 1
	}
	n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(in, limit))
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want != "" && (sum != want || n != size) {
		return "", fmt.Errorf("the staged binary is %d bytes with sha256 %s; the manifest says %d and %s", n, sum, size, want)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", err
	}
	atomicfile.SyncDir(filepath.Dir(dst))
	return sum, nil
}

// SetCrash sets the function called at each step's named point of
// Install, Confirm and the swap back (fakehw end-to-end tests kill the
// process there, BCD_UPDATE_KILL_AT).
func (s *Slots) SetCrash(f func(point string)) { s.crash = f }
