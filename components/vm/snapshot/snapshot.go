// Package snapshot is instance.snapshot, the provision-lane command that
// snapshots one instance of a VPS host: its disk flattened into a qcow2
// of its own (qemu-img convert while the domain is stopped), and with
// memory its saved memory (libvirt.save through bcd helper), packed with
// a manifest into one uncompressed tar staged under data_dir/snapshots,
// then PUT to a presigned https URL with its SHA-256 in the result. A
// running or paused domain is saved first whatever was asked (the disk
// is then quiet and consistent with the memory) and resumed from root's
// saved state once its disk is copied. The upload ends with the
// command's deadline or when it stalls (stall), and reports its progress.
// Exactly once: a node that stopped during the command does not run it
// again, and Recover says how far it got from the marker it left.
// docs/instances.md, "Snapshots".
package snapshot

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/base/stall"
	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/vmruntime"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Kind is the command's name.
const Kind = "instance.snapshot"

// Saver is what a runtime that saves memory offers (libvirt-kvm through
// bcd helper's libvirt.save): the domain stops with its memory in the
// instance's directory as MemoryFile, and starting it resumes it.
type Saver interface {
	SaveMemory(ctx context.Context, id string) error
}

// Config wires the command.
type Config struct {
	// DataDir is the node's data_dir: instances under instances/, the
	// staging under snapshots/.
	DataDir string
	// Runtime is the instance runtime; nil: this host runs none.
	Runtime vmruntime.Runtime
	// Client makes the upload; nil: the system's roots.
	Client *http.Client
	// Stall ends an upload that stops moving (zero: 1 MiB in 2 minutes).
	Stall stall.Rule
	// Progress reports the running command's progress (the session's
	// ReportProgress); nil: none.
	Progress func(ctx context.Context, commandID string, v any)
	// ProgressEvery paces progress reports (0: one second).
	ProgressEvery time.Duration
	// QEMUImg is qemu-img ("": found on PATH).
	QEMUImg string
	// Busy holds the instances a snapshot works on (the converger leaves
	// them alone meanwhile); nil: a Busy of its own.
	Busy *Busy
}

// Busy is the set of instances a snapshot holds.
type Busy struct {
	mu  sync.Mutex
	ids map[string]bool
}

// Has reports whether a snapshot holds id (the instances converger's
// Busy).
func (b *Busy) Has(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ids[id]
}

func (b *Busy) hold(id string) (func(), bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ids[id] {
		return nil, false
	}
	if b.ids == nil {
		b.ids = map[string]bool{}
	}
	b.ids[id] = true
	return func() { b.mu.Lock(); delete(b.ids, id); b.mu.Unlock() }, true
}

// body is the command's body.
type body struct {
	Instance string `json:"instance"`
	Memory   bool   `json:"memory"`
	URL      string `json:"url"`
}

// Result is what a snapshot reports.
type Result struct {
	Instance string `json:"instance"`
	Memory   bool   `json:"memory"`
	// Bytes and SHA256 are the uploaded archive's.
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Target is the upload URL's scheme and host only.
	Target   string `json:"target"`
	Uploaded bool   `json:"uploaded"`
	// Phase is how far an interrupted snapshot got: staging or uploading.
	Phase string `json:"phase,omitempty"`
}

// marker is what a running snapshot leaves in its staging directory for
// Recover: its phase, and once staged the archive's size and digest.
type marker struct {
	Command  string `json:"command"`
	Instance string `json:"instance"`
	Memory   bool   `json:"memory"`
	Target   string `json:"target"`
	Phase    string `json:"phase"`
	Bytes    int64  `json:"bytes,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
}

const (
	phaseStaging   = "staging"
	phaseUploading = "uploading"
	markerFile     = "state.json"
	archiveFile    = "snapshot.tar"
)

// Target is a URL's scheme and host: all of an upload URL that reaches a
// log, an error or a result (the rest may carry a presigned signature).
func Target(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(not a URL)"
	}
	return u.Scheme + "://" + u.Host
}

// stagingDir is the command's own directory under data_dir/snapshots,
// named by a digest of its id (any id, no path).
func (c Config) stagingDir(commandID string) string {
	sum := sha256.Sum256([]byte(commandID))
	return filepath.Join(c.DataDir, "snapshots", "cmd-"+hex.EncodeToString(sum[:12]))
}

// NewKind is instance.snapshot on the provision lane, locking its
// instance.
func NewKind(cfg Config) dispatch.Kind {
	if cfg.Busy == nil {
		cfg.Busy = &Busy{}
	}
	return dispatch.Kind{
		Name: Kind, Lane: dispatch.LaneProvision,
		Resources: func(b []byte) ([]string, error) {
			var bd body
			if err := dispatch.DecodeBody(b, &bd); err != nil {
				return nil, err
			}
			return []string{"instance:" + bd.Instance}, nil
		},
		Run: func(ctx context.Context, b []byte) (json.RawMessage, error) {
			var bd body
			if err := dispatch.DecodeBody(b, &bd); err != nil {
				return nil, err
			}
			res, err := cfg.take(ctx, dispatch.CommandID(ctx), bd)
			out, _ := json.Marshal(res)
			return out, err
		},
		Recover: cfg.recover,
	}
}

// check refuses a body before anything is touched.
func check(bd body) error {
	if !domainxml.ValidID(bd.Instance) {
		return errors.New(`body: "instance" must be an instance id`)
	}
	u, err := url.Parse(bd.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf(`body: "url" must be a presigned https URL (got %s)`, Target(bd.URL))
	}
	return nil
}

func (c Config) take(ctx context.Context, commandID string, bd body) (Result, error) {
	res := Result{Instance: bd.Instance, Memory: bd.Memory, Target: Target(bd.URL)}
	if err := check(bd); err != nil {
		return res, err
	}
	if c.Runtime == nil {
		return res, errors.New("this host runs no instance runtime")
	}
	release, ok := c.Busy.hold(bd.Instance)
	if !ok {
		return res, fmt.Errorf("instance %s: another snapshot of it is running", bd.Instance)
	}
	defer release()
	dir := c.stagingDir(commandID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, fmt.Errorf("staging: %w", err)
	}
	defer os.RemoveAll(dir)
	mk := marker{Command: commandID, Instance: bd.Instance, Memory: bd.Memory, Target: res.Target, Phase: phaseStaging}
	if err := writeMarker(dir, mk); err != nil {
		return res, err
	}
	c.progress(ctx, commandID, map[string]any{"phase": "staging", "instance": bd.Instance})
	archive := filepath.Join(dir, archiveFile)
	n, sum, err := c.stage(ctx, commandID, bd, dir, archive)
	if err != nil {
		return res, err
	}
	res.Bytes, res.SHA256 = n, sum
	mk.Phase, mk.Bytes, mk.SHA256 = phaseUploading, n, sum
	if err := writeMarker(dir, mk); err != nil {
		return res, err
	}
	if err := c.upload(ctx, commandID, bd.URL, archive, n); err != nil {
		return res, err
	}
	res.Uploaded = true
	return res, nil
}

// stage makes the archive: the domain saved when it runs (its disk then
// quiet), the disk flattened, the domain resumed, then the tar.
func (c Config) stage(ctx context.Context, commandID string, bd body, dir, archive string) (int64, string, error) {
	var dom *vmruntime.Domain
	l, err := c.Runtime.List(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("listing domains: %w", err)
	}
	for i := range l {
		if l[i].ID == bd.Instance {
			dom = &l[i]
		}
	}
	switch {
	case dom == nil:
		return 0, "", fmt.Errorf("instance %s: %w", bd.Instance, vmruntime.ErrNotFound)
	case !dom.Owned:
		return 0, "", fmt.Errorf("instance %s: %w", bd.Instance, vmruntime.ErrForeign)
	}
	live := dom.State != vmruntime.Stopped
	if bd.Memory && !live {
		return 0, "", fmt.Errorf("instance %s is STOPPED: a memory snapshot needs it RUNNING or PAUSED", bd.Instance)
	}
	saver, canSave := c.Runtime.(Saver)
	if live && !canSave {
		return 0, "", fmt.Errorf("instance %s: the %s runtime cannot save a running domain; stop it for a disk snapshot", bd.Instance, c.Runtime.Name())
	}
	instDir := filepath.Join(c.DataDir, "instances", bd.Instance)
	mem := filepath.Join(instDir, MemoryFile)
	if live {
		c.progress(ctx, commandID, map[string]any{"phase": "saving", "instance": bd.Instance})
		if err := saver.SaveMemory(ctx, bd.Instance); err != nil {
			return 0, "", fmt.Errorf("saving instance %s: %w", bd.Instance, err)
		}
	}
	disk := filepath.Join(dir, DiskFile)
	cerr := c.convert(ctx, filepath.Join(instDir, vmruntime.DiskFile), disk)
	if live {
		// Resumed from root's saved state, as it was, whatever the copy did.
		if err := c.Runtime.SetState(context.WithoutCancel(ctx), bd.Instance, vmruntime.Running); err != nil && cerr == nil {
			cerr = fmt.Errorf("resuming instance %s: %w", bd.Instance, err)
		}
	}
	members := []member{{DiskFile, disk}}
	if bd.Memory {
		staged := filepath.Join(dir, MemoryFile)
		if err := os.Rename(mem, staged); err != nil && cerr == nil {
			cerr = fmt.Errorf("staging the saved memory: %w", err)
		}
		members = append(members, member{MemoryFile, staged})
	} else {
		os.Remove(mem)
	}
	if cerr != nil {
		return 0, "", cerr
	}
	m := Manifest{Version: 1, Instance: bd.Instance, VCPUs: dom.Machine.VCPUs, MemoryMiB: dom.Machine.MemoryMiB, Memory: bd.Memory,
		CPU: HostCPU(), Created: time.Now().UTC().Truncate(time.Second)}
	n, sum, err := writeArchive(archive, m, members)
	for _, x := range members {
		os.Remove(x.path)
	}
	return n, sum, err
}

// convert flattens the instance's disk (an overlay of its base) into a
// qcow2 of its own, naming no backing file.
func (c Config) convert(ctx context.Context, src, dst string) error {
	tool := c.QEMUImg
	if tool == "" {
		tool = "qemu-img"
	}
	out, err := exec.CommandContext(ctx, tool, "convert", "-q", "-f", "qcow2", "-O", "qcow2", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img convert: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// upload PUTs the archive to rawURL, bounded by ctx (the command's
// deadline) and ended when it stalls, reporting progress.
func (c Config) upload(ctx context.Context, commandID, rawURL, path string, size int64) error {
	target := Target(rawURL)
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, counted, stop := stall.Watch(ctx, c.Stall)
	defer stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		every := c.ProgressEvery
		if every <= 0 {
			every = time.Second
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				c.progress(ctx, commandID, map[string]any{"phase": "uploading", "sent": counted.Total(), "bytes": size})
			}
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, rawURL, counted.Reader(f))
	if err != nil {
		return fmt.Errorf("uploading to %s: not a URL", target)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/x-tar")
	client := c.Client
	if client == nil {
		client = &http.Client{}
	}
	cl := *client
	cl.CheckRedirect = func(*http.Request, []*http.Request) error {
		return errors.New("the upload URL redirected; a presigned URL does not")
	}
	resp, err := cl.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("uploading to %s: %w", target, stall.Err(ctx, err))
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("uploading to %s: %s", target, resp.Status)
	}
	return nil
}

func (c Config) progress(ctx context.Context, commandID string, v any) {
	if c.Progress != nil && commandID != "" {
		c.Progress(ctx, commandID, v)
	}
}

func writeMarker(dir string, m marker) error {
	b, _ := json.Marshal(m)
	if err := atomicfile.Write(filepath.Join(dir, markerFile), b, 0o600); err != nil {
		return fmt.Errorf("staging: %w", err)
	}
	return nil
}

// recover settles a snapshot the node stopped during: it is not run
// again (a second upload under the same command id could overwrite what
// the first sent), its staging is removed, and the result says how far
// it got. Without a marker the command never staged anything: the
// default INTERRUPTED.
func (c Config) recover(e *journal.Entry) *bcdv1.CommandResult {
	dir := c.stagingDir(e.ID)
	defer os.RemoveAll(dir)
	b, err := os.ReadFile(filepath.Join(dir, markerFile))
	var mk marker
	if err != nil || json.Unmarshal(b, &mk) != nil || mk.Command != e.ID {
		return nil
	}
	res := Result{Instance: mk.Instance, Memory: mk.Memory, Bytes: mk.Bytes, SHA256: mk.SHA256, Target: mk.Target, Phase: mk.Phase}
	out, _ := json.Marshal(res)
	msg := fmt.Sprintf("the node stopped while staging the snapshot of %s; nothing was uploaded, and it was not run again", mk.Instance)
	if mk.Phase == phaseUploading {
		msg = fmt.Sprintf("the node stopped while uploading the snapshot of %s (%d bytes, sha256 %s) to %s; it was not uploaded again, and what reached the target may be partial: send a new instance.snapshot",
			mk.Instance, mk.Bytes, mk.SHA256, mk.Target)
	}
	return &bcdv1.CommandResult{Status: dispatch.Interrupted, Error: msg, Output: out, StartedUnixMs: e.StartedAt.UnixMilli()}
}

// HostCPU is this host's CPU model as /proc/cpuinfo names it ("" when
// it cannot be read): a memory snapshot restores only onto the same.
func HostCPU() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
