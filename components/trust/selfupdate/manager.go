package selfupdate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/trust/release"
)

// Installer is the privileged half of self-update: it decides what goes
// into the slots and what runs. A node that owns its slots runs a
// Manager in process; under [helper] the helper runs the Manager with
// its own configuration and clock, and the node reaches it through the
// helper's update.* operations (helperclient). Either way the node only
// downloads the artifact Prepare names into its staging directory and
// restarts after Swap. Refusals that no retry changes are
// *release.FinalError (release.IsFinal).
type Installer interface {
	// Status reads the slots, the floor and what is pending or failed.
	Status(ctx context.Context) (State, error)
	// Prepare verifies a signed manifest document and names the artifact
	// to download for this machine, and the staged file's name.
	Prepare(ctx context.Context, doc []byte) (Prepared, error)
	// Swap verifies the document again, installs the staged download
	// (StagedName of its version, in the staging directory the installer
	// knows: it takes no path) into the slot not running, and points
	// current at it.
	Swap(ctx context.Context, doc []byte) (Upgrade, error)
	// Confirm is the new binary's first Welcome: it raises the floor.
	Confirm(ctx context.Context) (bool, error)
	// Settle swaps back a pending upgrade past its deadline.
	Settle(ctx context.Context) (string, error)
	// Rollback swaps back a pending upgrade now.
	Rollback(ctx context.Context) (string, error)
	// ClearFailed forgets the failed versions.
	ClearFailed(ctx context.Context) error
}

// State is the slots as an installer reads them.
type State struct {
	Initialized bool            `json:"initialized"`
	Current     string          `json:"current,omitempty"`
	Slots       map[string]Slot `json:"slots,omitempty"`
	Floor       uint64          `json:"floor"`
	Pending     *Upgrade        `json:"pending,omitempty"`
	Failed      []string        `json:"failed,omitempty"`
}

// Prepared is Prepare's answer: the release and the artifact to fetch.
type Prepared struct {
	Version  string           `json:"version"`
	Sequence uint64           `json:"sequence"`
	Artifact release.Artifact `json:"artifact"`
	// Staged is the file name the download must have in the staging
	// directory.
	Staged string `json:"staged"`
}

// Manager is the in-process Installer over a slots directory.
type Manager struct {
	Slots *Slots
	// Pins and Threshold are the release keys ([update] release_pins).
	Pins      []string
	Threshold int
	// Role and Arch choose the artifact (e.g. node, amd64).
	Role, Arch string
	// StagingDir is where downloads are written (the node's
	// data_dir/staging); Owner is the uid that must own a staged file.
	StagingDir string
	Owner      int
	// Adopt is the binary adopted into slot A, at AdoptVersion and
	// AdoptSequence (the installed package's release sequence,
	// buildinfo.ReleaseSequence: the floor starts there), before the
	// first update. With RootAdopt it must be a root-owned regular file
	// that group and others cannot write (the helper: root will run it).
	Adopt         string
	AdoptVersion  string
	AdoptSequence uint64
	RootAdopt     bool
	Now           func() time.Time
}

var _ Installer = (*Manager)(nil)

func (m *Manager) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Status implements Installer.
func (m *Manager) Status(context.Context) (State, error) {
	r, cur, up, err := m.Slots.Read()
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, nil
	}
	if err != nil {
		return State{}, err
	}
	return State{Initialized: true, Current: cur, Slots: r.Slots, Floor: r.Floor, Pending: up, Failed: r.Failed}, nil
}

// init adopts the running binary when there are no slots yet.
func (m *Manager) init() error {
	if _, err := os.Lstat(m.Slots.path(Current)); err == nil {
		return nil
	}
	if m.Adopt == "" {
		return errors.New("no slots yet and no binary to adopt into them")
	}
	if m.RootAdopt {
		fi, err := os.Lstat(m.Adopt)
		if err != nil {
			return fmt.Errorf("adopting %s: %w", m.Adopt, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !fi.Mode().IsRegular() || !ok || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("adopting %s: not a root-owned regular file that only root can write (mode %s)", m.Adopt, fi.Mode())
		}
	}
	return m.Slots.Init(m.Adopt, m.AdoptVersion, m.AdoptSequence)
}

// verify checks doc under the pins, the floor and the failed versions
// at the manager's clock, and picks this machine's artifact.
func (m *Manager) verify(doc []byte) (release.Manifest, release.Artifact, error) {
	if err := m.init(); err != nil {
		return release.Manifest{}, release.Artifact{}, err
	}
	r, cur, up, err := m.Slots.Read()
	if err != nil {
		return release.Manifest{}, release.Artifact{}, err
	}
	man, err := release.Verify(doc, release.Policy{Pins: m.Pins, Threshold: m.Threshold, Floor: r.Floor}, m.now())
	if err != nil {
		return man, release.Artifact{}, err
	}
	// The floor's own sequence is only the release that runs (Prepare
	// answers it, and the agent finds nothing to do); any other release
	// at it is no newer than the last confirmed, and Install refuses it.
	if running := r.Slots[cur]; man.Sequence == r.Floor && (man.Version != running.Version || man.Sequence != running.Sequence) {
		return man, release.Artifact{}, &release.FinalError{Err: fmt.Errorf("release %s (sequence %d) is not above the release floor %d and is not the release that runs (%s)", man.Version, man.Sequence, r.Floor, running.Version)}
	}
	switch {
	case slices.Contains(r.Failed, man.Version):
		return man, release.Artifact{}, &release.FinalError{Err: fmt.Errorf("release %s failed before: it is not tried again until bcd update --clear-failed", man.Version)}
	case up != nil && up.Version != man.Version:
		return man, release.Artifact{}, fmt.Errorf("an upgrade to %s waits for its confirmation", up.Version)
	}
	a, err := man.Artifact(m.Role, m.Arch)
	return man, a, err
}

// Prepare implements Installer.
func (m *Manager) Prepare(_ context.Context, doc []byte) (Prepared, error) {
	man, a, err := m.verify(doc)
	if err != nil {
		return Prepared{}, err
	}
	return Prepared{Version: man.Version, Sequence: man.Sequence, Artifact: a, Staged: StagedName(man.Version)}, nil
}

// Swap implements Installer.
func (m *Manager) Swap(_ context.Context, doc []byte) (Upgrade, error) {
	man, a, err := m.verify(doc)
	if err != nil {
		return Upgrade{}, err
	}
	dir, f, err := OpenStaged(m.StagingDir, StagedName(man.Version), m.Owner)
	if err != nil {
		return Upgrade{}, err
	}
	defer dir.Close()
	defer f.Close()
	up, err := m.Slots.Install(f, man, a)
	if err != nil {
		return Upgrade{}, err
	}
	unix.Unlinkat(int(dir.Fd()), StagedName(man.Version), 0)
	return up, nil
}

// Confirm implements Installer.
func (m *Manager) Confirm(context.Context) (bool, error) { return m.Slots.Confirm() }

// Settle implements Installer.
func (m *Manager) Settle(context.Context) (string, error) { return m.Slots.Settle() }

// Rollback implements Installer.
func (m *Manager) Rollback(context.Context) (string, error) { return m.Slots.Rollback() }

// ClearFailed implements Installer.
func (m *Manager) ClearFailed(context.Context) error { return m.Slots.ClearFailed() }

// OpenStaged opens name in the staging directory dir for reading
// without following a symlink (neither dir's last component nor name)
// and without blocking on a FIFO, and takes it only as a regular file
// with one link owned by uid: a staged file is the node's, and root
// copies from it only what the node could not have swapped under it.
// It returns the directory too, so the caller can remove the file where
// it opened it.
func OpenStaged(dir, name string, uid int) (*os.File, *os.File, error) {
	if name != filepath.Base(name) || name == "." || name == ".." {
		return nil, nil, fmt.Errorf("staged file name %q is not a plain name", name)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the staging directory %s: %w", dir, err)
	}
	d := os.NewFile(uintptr(dfd), dir)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("opening the staged file %s: %w", filepath.Join(dir, name), err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, name))
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	switch {
	case err != nil:
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = errors.New("not a regular file")
	case st.Nlink != 1:
		err = fmt.Errorf("%d links, want 1", st.Nlink)
	case int(st.Uid) != uid:
		err = fmt.Errorf("owned by uid %d, want %d", st.Uid, uid)
	}
	if err != nil {
		f.Close()
		d.Close()
		return nil, nil, fmt.Errorf("the staged file %s is refused: %w", filepath.Join(dir, name), err)
	}
	return d, f, nil
}
