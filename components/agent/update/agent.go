package update

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/trust/release"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// KindName is the self-terminating command that upgrades a node or
// site agent to a signed release.
const KindName = release.UpgradeKind

// CommandFile is, in data_dir, the daemon.upgrade a swap restarted for:
// written before the restart, read by the next binary's Recover.
const CommandFile = "upgrade-command.json"

// maxManifest bounds a fetched manifest document (release.Verify's own
// bound is 64 KiB).
const maxManifest = 64 << 10

// Agent is self-update inside a running node or site agent: Start
// settles what a previous run left, Welcomed confirms the running
// release on the session's first Welcome, Kind is daemon.upgrade and
// Section the daemon desired-state section. The privileged half is the
// Installer (the in-process Manager, or the helper).
type Agent struct {
	Installer Installer
	// StagingDir is where downloads are written (data_dir/staging).
	StagingDir string
	// DataDir holds CommandFile.
	DataDir string
	// Version is the running binary's (buildinfo.Version).
	Version string
	// Client returns the HTTP client for a manifest or artifact URL
	// (the gateway's own host is reached through its pinned serving CA).
	Client func(u *url.URL) (*http.Client, error)
	Log    *slog.Logger

	mu        sync.Mutex
	restart   func()
	confirmed atomic.Bool
	// Progress, when set, receives download progress (tests, bench).
	Progress func(Progress)
}

// Progress is what daemon.upgrade reports while it works.
type Progress struct {
	Phase   string `json:"phase"`
	Version string `json:"version,omitempty"`
	Bytes   int64  `json:"bytes,omitempty"`
	Size    int64  `json:"size,omitempty"`
}

// Body is daemon.upgrade's body (release.UpgradeBody).
type Body = release.UpgradeBody

// SetRestart is given the agent's restart: it stops the agent so the
// role's main executes the slots' current binary.
func (a *Agent) SetRestart(f func()) { a.restart = f }

func (a *Agent) log() *slog.Logger {
	if a.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Log.With("component", "update")
}

// Start settles the slots at start: a swap past its deadline is undone
// and its version recorded failed. It never stops the agent: a node
// whose slots cannot be read still runs (bcd doctor reports it).
func (a *Agent) Start(ctx context.Context) {
	v, err := a.Installer.Settle(ctx)
	switch {
	case err != nil:
		a.log().Error("settling the self-update slots", "err", err)
	case v != "":
		a.log().Error("self-update rolled back: the new release did not confirm by its deadline", "version", v)
	}
}

// Welcomed is the session's Welcome: the first one confirms a pending
// upgrade to the running binary, which raises the release floor.
func (a *Agent) Welcomed(ctx context.Context) {
	if a.confirmed.Load() {
		return
	}
	st, err := a.Installer.Status(ctx)
	if err != nil {
		a.log().Error("reading the self-update slots", "err", err)
		return
	}
	if st.Pending == nil {
		a.confirmed.Store(true)
		return
	}
	if st.Pending.Version != a.Version {
		// Not the new binary (the swap happened under an old one that
		// has not restarted yet): only the new one confirms.
		return
	}
	ok, err := a.Installer.Confirm(ctx)
	if err != nil {
		a.log().Error("confirming the upgrade", "version", a.Version, "err", err)
		return
	}
	a.confirmed.Store(true)
	if ok {
		a.log().Info("self-update confirmed", "version", a.Version, "sequence", st.Pending.Sequence)
	}
}

// commandRecord is CommandFile.
type commandRecord struct {
	CommandID string `json:"command_id"`
	From      string `json:"from"`
	To        string `json:"to"`
	Sequence  uint64 `json:"sequence"`
}

// Kind is daemon.upgrade. It verifies the release, downloads this
// machine's artifact into staging (size and SHA-256 checked as it is
// written, progress reported), has the installer swap it in, records the
// command in CommandFile and restarts; the new binary's Recover reports
// it. A refusal no retry changes (release.FinalError) fails it with the
// reason and swaps nothing.
func (a *Agent) Kind() dispatch.Kind {
	return dispatch.Kind{
		Name:      KindName,
		Resources: func([]byte) ([]string, error) { return []string{"daemon"}, nil },
		Run: func(ctx context.Context, body []byte) (json.RawMessage, error) {
			var b Body
			if err := dispatch.DecodeBody(body, &b); err != nil {
				return nil, fmt.Errorf("%s: %w", KindName, err)
			}
			doc, err := a.document(ctx, b)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", KindName, err)
			}
			id := dispatch.CommandID(ctx)
			prog := func(p Progress) {
				session.ReportProgress(ctx, id, p)
				if a.Progress != nil {
					a.Progress(p)
				}
			}
			up, same, err := a.Upgrade(ctx, doc, prog, func(up Upgrade) error {
				rec, _ := json.Marshal(commandRecord{CommandID: id, From: a.Version, To: up.Version, Sequence: up.Sequence})
				return atomicfile.Write(a.path(), rec, 0o600)
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", KindName, err)
			}
			if same {
				out, _ := json.Marshal(map[string]any{"version": a.Version, "already_running": true})
				return out, nil
			}
			a.log().Info("self-update swapped; restarting into the new release", "command_id", id, "version", up.Version, "deadline", up.Deadline)
			a.doRestart()
			<-ctx.Done()
			return nil, ctx.Err()
		},
		Recover: func(e *journal.Entry) *bcdv1.CommandResult {
			var rec commandRecord
			b, err := os.ReadFile(a.path())
			if err != nil || json.Unmarshal(b, &rec) != nil || rec.CommandID != e.ID {
				return nil
			}
			os.Remove(a.path())
			if a.Version != rec.To {
				return &bcdv1.CommandResult{Status: dispatch.Failed,
					Error: fmt.Sprintf("release %s did not take: %s runs (rolled back; bcd update shows why)", rec.To, a.Version)}
			}
			out, _ := json.Marshal(map[string]any{"from": rec.From, "version": rec.To, "sequence": rec.Sequence})
			return &bcdv1.CommandResult{Status: dispatch.Succeeded, Output: out, StartedUnixMs: e.StartedAt.UnixMilli()}
		},
	}
}

func (a *Agent) path() string { return a.DataDir + "/" + CommandFile }

func (a *Agent) doRestart() {
	if a.restart != nil {
		a.restart()
	}
}

// document returns the release document of b, fetching release_url.
func (a *Agent) document(ctx context.Context, b Body) ([]byte, error) {
	switch {
	case len(b.Release) > 0 && b.ReleaseURL != "":
		return nil, errors.New("give release or release_url, not both")
	case len(b.Release) > 0:
		// A JSON string is the document base64-encoded; an object is the
		// document itself.
		var s string
		if json.Unmarshal(b.Release, &s) == nil {
			doc, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, fmt.Errorf("release: %w", err)
			}
			return doc, nil
		}
		return b.Release, nil
	case b.ReleaseURL != "":
		r, err := a.get(ctx, b.ReleaseURL)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		doc, err := io.ReadAll(io.LimitReader(r, maxManifest+1))
		if err != nil {
			return nil, fmt.Errorf("fetching the release document: %w", err)
		}
		if len(doc) > maxManifest {
			return nil, &release.FinalError{Err: fmt.Errorf("the release document at %s is over %d bytes", b.ReleaseURL, maxManifest)}
		}
		return doc, nil
	}
	return nil, errors.New("no release: give release (the signed document) or release_url")
}

// get opens an http(s) URL.
func (a *Agent) get(ctx context.Context, raw string) (io.ReadCloser, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, &release.FinalError{Err: fmt.Errorf("%q is not an http(s) URL", raw)}
	}
	c := http.DefaultClient
	if a.Client != nil {
		if c, err = a.Client(u); err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", u.Redacted(), resp.Status)
	}
	return resp.Body, nil
}

// Upgrade is the work of daemon.upgrade and the daemon section: Prepare,
// download, Swap. It reports same when doc's release is the one running
// (nothing to do), and calls before (when set) after the swap's checks
// passed and just before Swap, to record what the restart finishes.
func (a *Agent) Upgrade(ctx context.Context, doc []byte, prog func(Progress), before func(Upgrade) error) (Upgrade, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if prog == nil {
		prog = func(Progress) {}
	}
	p, err := a.Installer.Prepare(ctx, doc)
	if err != nil {
		return Upgrade{}, false, err
	}
	if p.Version == a.Version {
		return Upgrade{}, true, nil
	}
	prog(Progress{Phase: "download", Version: p.Version, Size: p.Artifact.Size})
	r, err := a.get(ctx, p.Artifact.URL)
	if err != nil {
		return Upgrade{}, false, err
	}
	cr := &countingReader{r: r, every: time.Second, report: func(n int64) {
		prog(Progress{Phase: "download", Version: p.Version, Bytes: n, Size: p.Artifact.Size})
	}}
	_, err = Download(cr, a.StagingDir, p.Version, p.Artifact)
	r.Close()
	if err != nil {
		// A download that is not the manifest's binary is refused for
		// good: the same URL serves the same wrong bytes.
		if ctx.Err() == nil && !cr.failed {
			err = &release.FinalError{Err: err}
		}
		return Upgrade{}, false, err
	}
	prog(Progress{Phase: "swap", Version: p.Version, Bytes: p.Artifact.Size, Size: p.Artifact.Size})
	if before != nil {
		if err := before(Upgrade{Version: p.Version, Sequence: p.Sequence}); err != nil {
			return Upgrade{}, false, err
		}
	}
	up, err := a.Installer.Swap(ctx, doc)
	if err != nil {
		os.Remove(a.path())
		return Upgrade{}, false, err
	}
	return up, false, nil
}

// countingReader counts what passes and reports it at most every
// `every`; failed records a read error (a broken connection is retried,
// wrong bytes are not).
type countingReader struct {
	r      io.Reader
	n      int64
	every  time.Duration
	last   time.Time
	report func(int64)
	failed bool
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.failed = true
	}
	if now := time.Now(); now.Sub(c.last) >= c.every {
		c.last = now
		c.report(c.n)
	}
	return n, err
}
