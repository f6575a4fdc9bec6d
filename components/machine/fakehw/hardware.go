package fakehw

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nvsmi"
	"github.com/better-compute/bcd/components/machine/xid"
)

// Hardware is the fake machine as the node kinds see it. Tests inject
// faults through files under DataDir/fakehw:
//
//   - kmsg: the fake kernel log. Lines appended to it in the format of
//     /dev/kmsg ("3,1234,5678901,-;NVRM: Xid (PCI:0000:5d:00): 79, pid=1,
//     name=x, GPU has fallen off the bus.") are read by the next XIDs (or
//     ResetGPU) with xid.Parse into the faults store the host build keeps,
//     DataDir/faults.json, for the fake boot of DataDir/fakehw/boot_id: a
//     restart of bcd in the same fake boot keeps them, a new boot id drops
//     them. kmsg.pos remembers how far the log was read; a line is read
//     once its newline is written.
//   - xids.json: a JSON list of nvsmi.XID, the older way, still read.
//
// A GPU reset clears that GPU's Xid errors from both and is logged to
// gpu-resets.log.
type Hardware struct {
	Seed    int64
	DataDir string
}

// The files of the fake machine under DataDir/fakehw.
const (
	// KmsgFile is the fake kernel log.
	KmsgFile = "kmsg"
	// kmsgPosFile holds the byte offset in KmsgFile read so far.
	kmsgPosFile = "kmsg.pos"
	// bootIDFile is the fake boot id, the file components/agent/hostinfo's
	// BootID reads and makes in a fakehw build.
	bootIDFile = "boot_id"
	xidsFile   = "xids.json"
)

// maxKmsgRead bounds what one read of the fake kernel log takes in; the
// rest is read by the next call.
const maxKmsgRead = 4 << 20

// faultsMu serializes the fake machine's file updates (the log position
// and the faults store) within the process: the node's health monitor and
// its kinds read and reset concurrently.
var faultsMu sync.Mutex

func (h Hardware) dir() string { return filepath.Join(h.DataDir, "fakehw") }

// KmsgPath is the fake kernel log, DataDir/fakehw/kmsg.
func (h Hardware) KmsgPath() string { return filepath.Join(h.dir(), KmsgFile) }

// Inventory is Machine(Seed).
func (h Hardware) Inventory(context.Context) (*inventory.Inventory, error) {
	return Machine(h.Seed), nil
}

// SMI answers like nvidia-smi on the fake machine.
func (h Hardware) SMI() nvsmi.Runner { return NvidiaSMI(h.Seed) }

// XIDs returns this fake boot's Xid errors: the injected xids.json ones,
// then those of the faults store (oldest first), after reading the lines
// appended to the fake kernel log since the last call into the store.
// When one source fails, the other's are returned with the error.
func (h Hardware) XIDs(context.Context) ([]nvsmi.XID, error) {
	faultsMu.Lock()
	defer faultsMu.Unlock()
	out, lerr := h.legacyXIDs()
	st, err := h.ingest()
	if st != nil {
		for _, e := range st.Events() {
			out = append(out, nvsmi.XID{Code: e.Code, PCIBusID: e.PCIBusID, Message: e.Message})
		}
	}
	return out, errors.Join(lerr, err)
}

// legacyXIDs reads the injected xids.json.
func (h Hardware) legacyXIDs() ([]nvsmi.XID, error) {
	b, err := os.ReadFile(filepath.Join(h.dir(), xidsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var x []nvsmi.XID
	if err := json.Unmarshal(b, &x); err != nil {
		return nil, fmt.Errorf("fakehw xids.json: %w", err)
	}
	return x, nil
}

// ingest loads the faults store and adds the Xid lines appended to the
// fake kernel log since the last read, saving the store before the new log
// position (a crash in between reads the lines again, and the store drops
// records it holds). It returns nil, nil when there is neither a log nor a
// store, so a fake machine nobody injected faults into needs no boot id.
// The caller holds faultsMu.
func (h Hardware) ingest() (*xid.Store, error) {
	if !exists(h.KmsgPath()) && !exists(filepath.Join(h.DataDir, xid.FaultsFile)) {
		return nil, nil
	}
	boot, err := h.BootID()
	if err != nil {
		return nil, err
	}
	st, err := xid.Load(h.DataDir, boot)
	if err != nil {
		return nil, err
	}
	events, pos, err := h.readKmsg()
	if err != nil {
		return nil, err
	}
	if st.Add(events...) > 0 {
		if err := st.Save(); err != nil {
			return nil, err
		}
	}
	if pos >= 0 {
		if err := atomicfile.Write(filepath.Join(h.dir(), kmsgPosFile), []byte(strconv.FormatInt(pos, 10)+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// readKmsg returns the Xid events of the complete lines appended to the
// fake kernel log since kmsg.pos, and the position after them (-1: it did
// not move). A log shorter than the position was truncated and is read
// from its start. Continuation lines (a leading space: a record's
// key=value dictionary) are skipped, as in /dev/kmsg.
func (h Hardware) readKmsg() ([]xid.Event, int64, error) {
	f, err := os.Open(h.KmsgPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, -1, nil
	}
	if err != nil {
		return nil, -1, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, -1, err
	}
	pos, err := h.kmsgPos()
	if err != nil {
		return nil, -1, err
	}
	if fi.Size() < pos {
		pos = 0
	}
	if fi.Size() == pos {
		return nil, -1, nil
	}
	b, err := io.ReadAll(io.LimitReader(io.NewSectionReader(f, pos, fi.Size()-pos), maxKmsgRead))
	if err != nil {
		return nil, -1, fmt.Errorf("read %s: %w", h.KmsgPath(), err)
	}
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		if len(b) == maxKmsgRead { // one line longer than the bound: skip it
			return nil, pos + int64(len(b)), nil
		}
		return nil, -1, nil // a line still being written
	}
	var events []xid.Event
	for _, line := range bytes.Split(b[:end], []byte("\n")) {
		if len(line) == 0 || line[0] == ' ' {
			continue
		}
		if ev, ok := xid.Parse(line); ok {
			events = append(events, ev)
		}
	}
	return events, pos + int64(end) + 1, nil
}

// kmsgPos reads kmsg.pos; 0 when there is none.
func (h Hardware) kmsgPos() (int64, error) {
	p := filepath.Join(h.dir(), kmsgPosFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("fakehw %s: %q is not an offset", kmsgPosFile, b)
	}
	return n, nil
}

// BootID is the fake machine's boot id: DataDir/fakehw/boot_id, made on
// first use. A fakehw build's components/agent/hostinfo.BootID reads and
// makes the same file (the fake machine "reboots" when it changes); fakehw
// reads it itself because the helper role links fakehw and must not link
// the agent domain.
func (h Hardware) BootID() (string, error) {
	p := filepath.Join(h.dir(), bootIDFile)
	if b, err := os.ReadFile(p); err == nil && len(bytes.TrimSpace(b)) > 0 {
		return string(bytes.TrimSpace(b)), nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err := os.MkdirAll(h.dir(), 0o700); err != nil {
		return "", err
	}
	id, err := newBootID()
	if err != nil {
		return "", err
	}
	// Made beside and linked into place: if another writer made it first,
	// its id is the boot's.
	tmp, err := os.CreateTemp(h.dir(), "."+bootIDFile+".*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(id + "\n")
	if serr := tmp.Sync(); err == nil {
		err = serr
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if err := os.Link(tmp.Name(), p); errors.Is(err, fs.ErrExist) {
		b, rerr := os.ReadFile(p)
		if rerr != nil {
			return "", rerr
		}
		return string(bytes.TrimSpace(b)), nil
	} else if err != nil {
		return "", err
	}
	return id, nil
}

// newBootID makes a random boot id in the kernel's format (a version 4
// UUID).
func newBootID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:]), nil
}

// ResetGPU logs the reset and clears the GPU's Xid errors: the injected
// xids.json ones, and those of the faults store (after reading what the
// fake kernel log holds, so an Xid logged before the reset is cleared by
// it).
func (h Hardware) ResetGPU(ctx context.Context, g nvsmi.GPU) error {
	faultsMu.Lock()
	defer faultsMu.Unlock()
	if err := os.MkdirAll(h.dir(), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(h.dir(), "gpu-resets.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s %s %d\n", g.UUID, g.PCIBusID, time.Now().UnixMilli())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	st, err := h.ingest()
	if err != nil {
		return err
	}
	if st != nil && g.PCIBusID != "" && st.Clear(g.PCIBusID) > 0 {
		if err := st.Save(); err != nil {
			return err
		}
	}
	x, err := h.legacyXIDs()
	if err != nil || len(x) == 0 {
		return err
	}
	keep := x[:0]
	for _, e := range x {
		if !sameGPU(e, g) {
			keep = append(keep, e)
		}
	}
	b, _ := json.Marshal(keep)
	return os.WriteFile(filepath.Join(h.dir(), xidsFile), b, 0o600)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// sameGPU reports whether the Xid names g, by UUID or by PCI address (the
// kernel's is without the function: "0000:5d:00" is "0000:5d:00.0").
func sameGPU(x nvsmi.XID, g nvsmi.GPU) bool {
	if x.UUID != "" && x.UUID == g.UUID {
		return true
	}
	return x.PCIBusID != "" && device(x.PCIBusID) == device(g.PCIBusID)
}

// device is a PCI address normalized, without its function.
func device(busID string) string {
	d, _, _ := strings.Cut(nvsmi.NormalizeBusID(strings.TrimPrefix(strings.TrimSpace(busID), "PCI:")), ".")
	return d
}
