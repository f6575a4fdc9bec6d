package update

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/trust/release"
	"github.com/better-compute/bcd/components/trust/release/releasetest"
)

// served is an HTTP server answering each path with its bytes.
func served(t *testing.T, files map[string][]byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// newAgent is an Agent over a Manager of r's keys, running version.
func newAgent(t *testing.T, r *releasetest.Keys, version string) (*Agent, *Manager, *aClock) {
	mgr, c := newAManager(t, r)
	data := t.TempDir()
	return &Agent{Installer: mgr, StagingDir: mgr.StagingDir, DataDir: data, Version: version}, mgr, c
}

// upgradeDoc is release version at seq, its artifact served by srv (at
// bytes served, which may differ from the release's binary).
func upgradeDoc(t *testing.T, r *releasetest.Keys, c *aClock, version string, seq uint64, files map[string][]byte, serve []byte, base string) []byte {
	m, bin := aRel(version, seq, c.t.Add(time.Hour))
	m.Artifacts[0].URL = base + "/bcd-" + version
	if serve == nil {
		serve = bin
	}
	files["/bcd-"+version] = serve
	return r.Sign(t, m, 2)
}

// TestKindUpgrades: daemon.upgrade downloads, swaps, records itself and
// restarts; the new binary's Recover reports it SUCCEEDED and its first
// Welcome confirms, raising the floor. The old binary's Recover of the
// same command (a rollback) reports it FAILED.
func TestKindUpgrades(t *testing.T) {
	r := releasetest.NewKeys(t, 3)
	a, mgr, c := newAgent(t, r, "0.1.0")
	files := map[string][]byte{}
	srv := served(t, files)
	doc := upgradeDoc(t, r, c, "0.2.0", 2, files, nil, srv.URL)
	var progress []Progress
	a.Progress = func(p Progress) { progress = append(progress, p) }
	ctx, cancel := context.WithCancel(bounded(t, dispatch.WithCommandID(context.Background(), "cmd_1")))
	restarted := false
	a.SetRestart(func() { restarted = true; cancel() })
	body, _ := json.Marshal(Body{Release: doc})
	_, err := a.Kind().Run(ctx, body)
	if !restarted || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, restarted %v", err, restarted)
	}
	if aRunning(t, mgr.Slots) != "bcd 0.2.0" {
		t.Fatal("current does not name the new release")
	}
	if len(progress) < 2 || progress[0].Phase != "download" || progress[len(progress)-1].Phase != "swap" {
		t.Errorf("progress %+v", progress)
	}
	e := &journal.Entry{ID: "cmd_1", Kind: KindName, StartedAt: time.Now()}

	// The new binary.
	next := &Agent{Installer: mgr, StagingDir: a.StagingDir, DataDir: a.DataDir, Version: "0.2.0"}
	res := next.Kind().Recover(e)
	if res == nil || res.Status != dispatch.Succeeded || !strings.Contains(string(res.Output), `"version":"0.2.0"`) {
		t.Fatalf("Recover = %+v", res)
	}
	if st, _ := mgr.Status(context.Background()); st.Pending == nil || st.Floor != 0 {
		t.Fatalf("confirmed before the Welcome: %+v", st)
	}
	next.Welcomed(context.Background())
	if st, _ := mgr.Status(context.Background()); st.Pending != nil || st.Floor != 2 {
		t.Fatalf("after the Welcome: %+v", st)
	}
	if res := next.Kind().Recover(e); res != nil {
		t.Errorf("a second Recover = %+v", res)
	}

	// A rollback: the old binary recovers the command.
	rec, _ := json.Marshal(commandRecord{CommandID: "cmd_2", From: "0.2.0", To: "0.3.0"})
	os.WriteFile(filepath.Join(a.DataDir, CommandFile), rec, 0o600)
	res = next.Kind().Recover(&journal.Entry{ID: "cmd_2"})
	if res == nil || res.Status != dispatch.Failed || !strings.Contains(res.Error, "release 0.3.0 did not take") {
		t.Fatalf("Recover after a rollback = %+v", res)
	}
}

// TestKindRefusesAsFinal: a release signed below the threshold, one
// whose served bytes differ from the manifest's hash, and one for
// another architecture fail as final with the reason, swap nothing and
// leave nothing staged nor recorded.
func TestKindRefusesAsFinal(t *testing.T) {
	r := releasetest.NewKeys(t, 3)
	cases := []struct {
		name string
		doc  func(a *Agent, c *aClock, files map[string][]byte, base string) []byte
		want string
	}{
		{"below threshold", func(a *Agent, c *aClock, files map[string][]byte, base string) []byte {
			m, _ := aRel("0.2.0", 2, c.t.Add(time.Hour))
			return r.Sign(t, m, 1)
		}, "signed by 1 of the pinned keys"},
		{"wrong hash", func(a *Agent, c *aClock, files map[string][]byte, base string) []byte {
			return upgradeDoc(t, r, c, "0.2.0", 2, files, []byte("bcd 0.6.6"), base)
		}, "sha256"},
		{"another architecture", func(a *Agent, c *aClock, files map[string][]byte, base string) []byte {
			m, _ := aRel("0.2.0", 2, c.t.Add(time.Hour))
			m.Artifacts[0].Arch = "arm64"
			return r.Sign(t, m, 2)
		}, "amd64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, mgr, c := newAgent(t, r, "0.1.0")
			files := map[string][]byte{}
			srv := served(t, files)
			doc := tc.doc(a, c, files, srv.URL)
			a.SetRestart(func() { t.Error("restarted") })
			body, _ := json.Marshal(Body{Release: doc})
			_, err := a.Kind().Run(bounded(t, dispatch.WithCommandID(context.Background(), "cmd_1")), body)
			var fe *release.FinalError
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a release the checks refuse is refused as final: Run took it and was still waiting after %s (%v)", runFor, err)
			}
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want a final error with %q", err, tc.want)
			}
			if st, _ := mgr.Status(context.Background()); st.Current != "" && st.Current != SlotA || st.Pending != nil {
				t.Errorf("swapped: %+v", st)
			}
			if ents, _ := os.ReadDir(a.StagingDir); len(ents) != 0 {
				t.Errorf("staged: %v", ents)
			}
			if _, err := os.Stat(filepath.Join(a.DataDir, CommandFile)); err == nil {
				t.Error("the command was recorded")
			}
		})
	}
}

// TestSection: the daemon section is converged at the running version,
// upgrades otherwise, and fails terminally on a final refusal or a
// release of another version than it asks for.
func TestSection(t *testing.T) {
	r := releasetest.NewKeys(t, 3)
	a, mgr, c := newAgent(t, r, "0.1.0")
	files := map[string][]byte{}
	srv := served(t, files)
	doc := upgradeDoc(t, r, c, "0.2.0", 2, files, nil, srv.URL)
	s := a.Section()
	ctx := bounded(t, context.Background())
	for _, bad := range []string{`{"version":"x"}`, `{"version":"0.2.0"}`, `{"release":{}}`, `{"version":"0.2.0","extra":1}`} {
		if err := s.Check(json.RawMessage(bad)); err == nil {
			t.Errorf("Check(%s) passed", bad)
		}
	}
	if p, err := s.Plan(ctx, json.RawMessage(`{"version":"0.1.0","release_url":"http://x/y"}`)); err != nil || len(p.Changes) != 0 {
		t.Errorf("Plan at the running version = %+v, %v", p, err)
	}
	body, _ := json.Marshal(DaemonSpec{Version: "0.3.0", Release: doc})
	p, err := s.Plan(ctx, body)
	if err != nil || len(p.Changes) != 1 {
		t.Fatalf("Plan = %+v, %v", p, err)
	}
	if err := s.Apply(ctx, body, p); !converge.IsTerminal(err) || !strings.Contains(err.Error(), "asks for 0.3.0") {
		t.Fatalf("Apply of another version = %v", err)
	}
	files["/release.json"] = doc
	body, _ = json.Marshal(DaemonSpec{Version: "0.2.0", ReleaseURL: srv.URL + "/release.json"})
	p, _ = s.Plan(ctx, body)
	actx, cancel := context.WithCancel(ctx)
	a.SetRestart(cancel)
	if err := s.Apply(actx, body, p); !errors.Is(err, context.Canceled) || aRunning(t, mgr.Slots) != "bcd 0.2.0" {
		t.Fatalf("Apply = %v", err)
	}
}

// The agent tests' own fixtures (the slots' and manager's tests keep
// theirs): release keys, a Manager over a temporary slots directory at a
// fixed clock, and a release with one node/amd64 binary.

type aClock struct{ t time.Time }

func (c *aClock) now() time.Time { return c.t }

func newAManager(t *testing.T, r *releasetest.Keys) (*Manager, *aClock) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bcd-installed")
	os.WriteFile(bin, []byte("bcd 0.1.0"), 0o755)
	c := &aClock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	return &Manager{
		Slots: &Slots{Dir: filepath.Join(dir, "slots"), Now: c.now},
		Pins:  r.Pins, Threshold: 2, Role: "node", Arch: "amd64",
		StagingDir: filepath.Join(dir, "staging"), Owner: os.Getuid(),
		Adopt: bin, AdoptVersion: "0.1.0", Now: c.now,
	}, c
}

// aRel is release version at seq, expiring then, with one node/amd64
// binary ("bcd VERSION").
func aRel(version string, seq uint64, expires time.Time) (release.Manifest, []byte) {
	bin := []byte("bcd " + version)
	sum := sha256.Sum256(bin)
	a := release.Artifact{Role: "node", Arch: "amd64", Size: int64(len(bin)), SHA256: hex.EncodeToString(sum[:]), URL: "https://r.example/" + version}
	return release.Manifest{Type: release.Type, Version: version, Sequence: seq, Expires: expires, Artifacts: []release.Artifact{a}}, bin
}

// aRunning is the binary current names.
func aRunning(t *testing.T, s *Slots) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.Dir, Current))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
