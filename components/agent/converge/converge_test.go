package converge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/nodespec"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// fileSection converges files named by its body ({"name":"content"})
// in a directory; fail makes Apply fail (retryable unless terminal) for
// its first failN attempts; lag makes a written file appear only after
// lag more plans.
type fileSection struct {
	name    string
	dir     string
	log     *[]string
	mu      *sync.Mutex
	failN   int
	term    bool
	lag     int
	applies int
	pending map[string]string
}

func newFiles(t *testing.T, name string, log *[]string, mu *sync.Mutex) *fileSection {
	return &fileSection{name: name, dir: t.TempDir(), log: log, mu: mu}
}

func (f *fileSection) Name() string { return f.name }

func (f *fileSection) decode(body json.RawMessage) (map[string]string, error) {
	m := map[string]string{}
	if body == nil {
		return m, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}

func (f *fileSection) Check(body json.RawMessage) error { _, err := f.decode(body); return err }

func (f *fileSection) Plan(_ context.Context, body json.RawMessage) (Plan, error) {
	want, err := f.decode(body)
	if err != nil {
		return Plan{}, Terminal(err)
	}
	if f.lag > 0 && len(f.pending) > 0 {
		f.lag--
		if f.lag == 0 {
			for k, v := range f.pending {
				os.WriteFile(filepath.Join(f.dir, k), []byte(v), 0o600)
			}
			f.pending = nil
		}
	}
	var p Plan
	for k, v := range want {
		b, err := os.ReadFile(filepath.Join(f.dir, k))
		if err != nil || string(b) != v {
			p.Changes = append(p.Changes, "write "+k)
		}
	}
	ents, _ := os.ReadDir(f.dir)
	for _, e := range ents {
		if _, ok := want[e.Name()]; !ok {
			p.Changes = append(p.Changes, "remove "+e.Name())
		}
	}
	return p, nil
}

func (f *fileSection) Apply(_ context.Context, body json.RawMessage, _ Plan) error {
	f.mu.Lock()
	*f.log = append(*f.log, f.name)
	f.mu.Unlock()
	f.applies++
	if f.applies <= f.failN {
		err := fmt.Errorf("%s: injected failure %d", f.name, f.applies)
		if f.term {
			return Terminal(err)
		}
		return err
	}
	want, _ := f.decode(body)
	ents, _ := os.ReadDir(f.dir)
	for _, e := range ents {
		if _, ok := want[e.Name()]; !ok {
			os.Remove(filepath.Join(f.dir, e.Name()))
		}
	}
	for k, v := range want {
		if f.lag > 0 {
			if f.pending == nil {
				f.pending = map[string]string{}
			}
			f.pending[k] = v
			continue
		}
		if err := os.WriteFile(filepath.Join(f.dir, k), []byte(v), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func full(gen uint64, spec string) *bcdv1.DesiredState {
	return &bcdv1.DesiredState{Generation: gen, Spec: []byte(spec)}
}

func patch(gen, base uint64, p string) *bcdv1.DesiredState {
	return &bcdv1.DesiredState{Generation: gen, Patch: true, BaseGeneration: base, Spec: []byte(p)}
}

func open(t *testing.T, dir string, sections ...Section) *Engine {
	t.Helper()
	e, err := Open(Config{DataDir: dir, Sections: sections, RetryBase: time.Millisecond, RetryMax: 5 * time.Millisecond, Recheck: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// settle runs passes until none is due (bounded).
func settle(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		next := e.Pass(context.Background())
		if next.IsZero() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no settled pass within 5 s: %+v", e.Status())
		}
		time.Sleep(max(time.Until(next), 0))
	}
}

func state(e *Engine, name string) SectionState {
	for _, s := range e.Status().Sections {
		if s.Name == name {
			return s
		}
	}
	return SectionState{}
}

func TestFullSpecConvergesAndIsStored(t *testing.T) {
	var log []string
	var mu sync.Mutex
	dir := t.TempDir()
	fh := newFiles(t, "fakehw", &log, &mu)
	e := open(t, dir, fh)
	if err := e.Offer(full(3, `{"fakehw":{"a":"1"}}`), time.Now()); err != nil {
		t.Fatal(err)
	}
	if e.Applied() != 3 || e.Observed() != 0 {
		t.Fatalf("before a pass: applied %d observed %d, want 3 and 0 (observed never runs ahead)", e.Applied(), e.Observed())
	}
	b, err := os.ReadFile(filepath.Join(dir, SpecFile))
	if err != nil || !strings.Contains(string(b), `"generation":3`) {
		t.Fatalf("stored spec: %s %v", b, err)
	}
	settle(t, e)
	if e.Observed() != 3 || state(e, "fakehw").State != Converged {
		t.Fatalf("status %+v", e.Status())
	}
	if got, _ := os.ReadFile(filepath.Join(fh.dir, "a")); string(got) != "1" {
		t.Errorf("file a = %q", got)
	}
	// Idempotent: another pass applies nothing.
	n := len(log)
	settle(t, e)
	if len(log) != n {
		t.Errorf("a converged section was applied again: %v", log)
	}
}

func TestRefusalsKeepTheHeldSpec(t *testing.T) {
	var log []string
	var mu sync.Mutex
	dir := t.TempDir()
	e := open(t, dir, newFiles(t, "fakehw", &log, &mu))
	if err := e.Offer(full(1, `{"fakehw":{"a":"1"}}`), time.Now()); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, SpecFile))
	for _, tt := range []struct {
		name     string
		ds       *bcdv1.DesiredState
		want     string
		wantFull bool
	}{
		{"unknown section", full(2, `{"gpus":{}}`), `unknown section "gpus"`, false},
		{"unknown field", full(2, `{"fakehw":{"a":1}}`), "section fakehw", false},
		{"wrong type", full(2, `{"fakehw":[1,2]}`), "section fakehw", false},
		{"not an object", full(2, `[]`), "not a JSON object", false},
		{"over 4 MiB", full(2, `{"fakehw":{"a":"`+strings.Repeat("x", 4<<20)+`"}}`), "at most", false},
		{"patch not an object", patch(2, 1, `"x"`), "not a JSON object", false},
		{"patch of unknown section", patch(2, 1, `{"gpus":{}}`), `unknown section`, false},
		{"patch onto another generation", patch(3, 2, `{"fakehw":{"b":"2"}}`), "holds generation 1", true},
		{"no generation", full(0, `{}`), "without a generation", false},
	} {
		err := e.Offer(tt.ds, time.Now())
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
		st := e.Status()
		if st.Applied != 1 || st.SpecError == "" || st.WantFull != tt.wantFull || st.RefusedGeneration != tt.ds.GetGeneration() {
			t.Errorf("%s: status %+v", tt.name, st)
		}
		if after, _ := os.ReadFile(filepath.Join(dir, SpecFile)); !bytes.Equal(before, after) {
			t.Errorf("%s: the stored spec changed", tt.name)
		}
	}
	// A good patch clears the refusal.
	if err := e.Offer(patch(2, 1, `{"fakehw":{"b":"2"}}`), time.Now()); err != nil {
		t.Fatal(err)
	}
	if st := e.Status(); st.SpecError != "" || st.WantFull || st.Applied != 2 {
		t.Errorf("after a good patch: %+v", st)
	}
	if _, raw := e.Spec(); string(raw) != `{"fakehw":{"a":"1","b":"2"}}` {
		t.Errorf("merged spec %s", raw)
	}
	// A stale generation is ignored, not refused.
	if err := e.Offer(full(1, `{}`), time.Now()); err != nil || e.Applied() != 2 {
		t.Errorf("stale: %v, applied %d", err, e.Applied())
	}
}

// TestFailingSectionDoesNotHoldBackLaterOnes: devices fails retryably
// twice, site terminally; fakehw after them still converges; the observed
// generation waits for devices' retries, then advances with site FAILED.
func TestFailingSectionDoesNotHoldBackLaterOnes(t *testing.T) {
	var log []string
	var mu sync.Mutex
	dev := newFiles(t, "devices", &log, &mu)
	dev.failN = 2
	site := newFiles(t, "site", &log, &mu)
	site.failN, site.term = 1000, true
	fh := newFiles(t, "fakehw", &log, &mu)
	e := open(t, t.TempDir(), fh, site, dev) // given out of order
	if err := e.Offer(full(1, `{"devices":{"d":"1"},"site":{"s":"1"},"fakehw":{"f":"1"}}`), time.Now()); err != nil {
		t.Fatal(err)
	}
	e.Pass(context.Background())
	if got := state(e, "devices"); got.State != Retrying || got.Attempts != 1 {
		t.Errorf("devices after one pass: %+v", got)
	}
	if got := state(e, "fakehw"); got.State != Converged {
		t.Errorf("fakehw after one pass: %+v (held back by the failures before it)", got)
	}
	if e.Observed() != 0 {
		t.Errorf("observed %d while devices retries", e.Observed())
	}
	settle(t, e)
	if got := state(e, "devices"); got.State != Converged {
		t.Errorf("devices: %+v", got)
	}
	if got := state(e, "site"); got.State != Failed || !strings.Contains(got.Message, "injected failure") {
		t.Errorf("site: %+v", got)
	}
	if e.Observed() != 1 {
		t.Errorf("observed %d, want 1 once every section settled", e.Observed())
	}
	mu.Lock()
	defer mu.Unlock()
	if log[0] != "devices" || log[1] != "site" || log[2] != "fakehw" {
		t.Errorf("apply order %v, want devices, site, fakehw first", log)
	}
	if n := strings.Count(strings.Join(log, " "), "site"); n != 1 {
		t.Errorf("a terminal failure was applied %d times in its generation", n)
	}
}

func TestUnsupportedSection(t *testing.T) {
	var log []string
	var mu sync.Mutex
	e := open(t, t.TempDir(), newFiles(t, "fakehw", &log, &mu))
	if err := e.Offer(full(1, `{"access":{"ssh":{}},"fakehw":{}}`), time.Now()); err != nil {
		t.Fatal(err)
	}
	settle(t, e)
	if got := state(e, "access"); got.State != Unsupported || !strings.Contains(got.Message, "SectionUnsupported") {
		t.Errorf("access: %+v", got)
	}
	if e.Observed() != 1 {
		t.Errorf("observed %d: an unsupported section is settled", e.Observed())
	}
}

func TestProgressingUntilDone(t *testing.T) {
	var log []string
	var mu sync.Mutex
	fh := newFiles(t, "fakehw", &log, &mu)
	fh.lag = 3
	e := open(t, t.TempDir(), fh)
	e.Offer(full(1, `{"fakehw":{"a":"1"}}`), time.Now())
	e.Pass(context.Background())
	if got := state(e, "fakehw"); got.State != Progressing || e.Observed() != 0 {
		t.Fatalf("after the apply: %+v, observed %d", got, e.Observed())
	}
	settle(t, e)
	if got := state(e, "fakehw"); got.State != Converged || e.Observed() != 1 || fh.applies < 1 {
		t.Errorf("%+v observed %d applies %d", got, e.Observed(), fh.applies)
	}
}

// TestRestartEnforcesTheStoredSpec: a new engine over the same data_dir
// holds the spec and observed generation, and a pass with no gateway
// repairs drift without applying what is already there.
func TestRestartEnforcesTheStoredSpec(t *testing.T) {
	var log []string
	var mu sync.Mutex
	dir := t.TempDir()
	fh := newFiles(t, "fakehw", &log, &mu)
	e := open(t, dir, fh)
	e.Offer(full(5, `{"fakehw":{"a":"1","b":"2"}}`), time.Now())
	settle(t, e)
	os.Remove(filepath.Join(fh.dir, "b")) // drift while the agent was down
	fh2 := &fileSection{name: "fakehw", dir: fh.dir, log: &log, mu: &mu}
	e2 := open(t, dir, fh2)
	if e2.Applied() != 5 || e2.Observed() != 5 {
		t.Fatalf("after restart: applied %d observed %d", e2.Applied(), e2.Observed())
	}
	settle(t, e2)
	if b, _ := os.ReadFile(filepath.Join(fh.dir, "b")); string(b) != "2" || fh2.applies != 1 {
		t.Errorf("drift not repaired: b=%q applies %d", b, fh2.applies)
	}
}

// TestObservedNeverAheadAfterACrash: a crash after the spec was stored
// and before the pass ended leaves observed at the old generation.
func TestObservedNeverAheadAfterACrash(t *testing.T) {
	var log []string
	var mu sync.Mutex
	dir := t.TempDir()
	fh := newFiles(t, "fakehw", &log, &mu)
	e := open(t, dir, fh)
	e.Offer(full(1, `{"fakehw":{"a":"1"}}`), time.Now())
	settle(t, e)
	e.Offer(full(2, `{"fakehw":{"a":"2"}}`), time.Now())
	// "Crash": no pass; a new engine reads what is on disk.
	e2 := open(t, dir, &fileSection{name: "fakehw", dir: fh.dir, log: &log, mu: &mu})
	if e2.Applied() != 2 || e2.Observed() != 1 {
		t.Fatalf("applied %d observed %d, want 2 and 1", e2.Applied(), e2.Observed())
	}
}

func TestBadStoredSpecIsMovedAside(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, SpecFile), []byte(`{"generation":4,"spec":{"gpus":1}}`), 0o600)
	e := open(t, dir)
	if e.Applied() != 0 {
		t.Errorf("applied %d from a spec that does not check", e.Applied())
	}
	if _, err := os.Stat(filepath.Join(dir, SpecFile+".bad")); err != nil {
		t.Errorf("not moved aside: %v", err)
	}
}

func TestOpenRefusesUnknownSection(t *testing.T) {
	var log []string
	var mu sync.Mutex
	if _, err := Open(Config{Sections: []Section{newFiles(t, "gpus", &log, &mu)}}); err == nil {
		t.Error("a section outside the NodeSpec's list was taken")
	}
	if _, err := Open(Config{Sections: []Section{newFiles(t, "host", &log, &mu), newFiles(t, "host", &log, &mu)}}); err == nil {
		t.Error("a section given twice was taken")
	}
}

func TestTerminal(t *testing.T) {
	base := errors.New("x")
	if !IsTerminal(fmt.Errorf("wrapped: %w", Terminal(base))) || IsTerminal(base) || Terminal(nil) != nil {
		t.Error("Terminal marks wrong")
	}
	if !errors.Is(Terminal(base), base) {
		t.Error("Terminal hides the error it wraps")
	}
}

// TestRunRepairsOnKick: Run converges a new spec offered while it runs.
func TestRunConvergesOffers(t *testing.T) {
	var log []string
	var mu sync.Mutex
	fh := newFiles(t, "fakehw", &log, &mu)
	changed := make(chan struct{}, 100)
	e, err := Open(Config{DataDir: t.TempDir(), Sections: []Section{fh}, Changed: func() { changed <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.Run(ctx) }()
	e.Offer(full(1, `{"fakehw":{"a":"1"}}`), time.Now())
	deadline := time.Now().Add(5 * time.Second)
	for e.Observed() != 1 && time.Now().Before(deadline) {
		<-changed
	}
	if e.Observed() != 1 {
		t.Errorf("Run did not converge the offer: %+v", e.Status())
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}

// FuzzOffer: any DesiredState is taken or refused without a panic; a
// refused one leaves the held spec as it was, and a taken one is held in
// canonical form that a new engine loads again.
func FuzzOffer(f *testing.F) {
	f.Add(uint64(2), false, uint64(0), []byte(`{"fakehw":{"b":"2"}}`))
	f.Add(uint64(2), true, uint64(1), []byte(`{"fakehw":{"a":null}}`))
	f.Add(uint64(2), true, uint64(1), []byte(`{"gpus":{}}`))
	f.Add(uint64(3), false, uint64(0), []byte(`{"fakehw":[1]}`))
	// The held generation again, with new content: ignored.
	f.Add(uint64(1), false, uint64(0), []byte(`{"fakehw":{"a":"2"}}`))
	f.Fuzz(func(t *testing.T, gen uint64, isPatch bool, base uint64, spec []byte) {
		var log []string
		var mu sync.Mutex
		dir := t.TempDir()
		fh := &fileSection{name: "fakehw", dir: t.TempDir(), log: &log, mu: &mu}
		e := open(t, dir, fh)
		if err := e.Offer(full(1, `{"fakehw":{"a":"1"}}`), time.Now()); err != nil {
			t.Fatal(err)
		}
		before, _ := os.ReadFile(filepath.Join(dir, SpecFile))
		err := e.Offer(&bcdv1.DesiredState{Generation: gen, Patch: isPatch, BaseGeneration: base, Spec: spec}, time.Now())
		after, _ := os.ReadFile(filepath.Join(dir, SpecFile))
		if err != nil || gen <= 1 {
			if !bytes.Equal(before, after) || e.Applied() != 1 {
				t.Fatalf("a generation at or below the held one is ignored, and a refused spec changes nothing: generation %d (holding 1) changed the held spec (%v)", gen, err)
			}
			return
		}
		e2 := open(t, dir, &fileSection{name: "fakehw", dir: fh.dir, log: &log, mu: &mu})
		if e2.Applied() != gen {
			t.Fatalf("taken generation %d, a new engine holds %d", gen, e2.Applied())
		}
	})
}

// TestVerifyRefuses: a DesiredState that fails the signature check is
// refused with the held spec unchanged.
func TestVerifyRefuses(t *testing.T) {
	var log []string
	var mu sync.Mutex
	dir := t.TempDir()
	e, err := Open(Config{DataDir: dir, Sections: []Section{newFiles(t, "fakehw", &log, &mu)},
		Verify: func(ds *bcdv1.DesiredState, _ nodespec.Spec) error {
			if len(ds.GetSignature()) == 0 {
				return errors.New("UNSIGNED: no signature")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ok := full(1, `{"fakehw":{"a":"1"}}`)
	ok.Signature = []byte("s")
	if err := e.Offer(ok, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.Offer(full(2, `{"fakehw":{"a":"2"}}`), time.Now()); err == nil || !strings.Contains(err.Error(), "UNSIGNED") {
		t.Fatalf("unsigned: %v", err)
	}
	if st := e.Status(); st.Applied != 1 || !strings.Contains(st.SpecError, "UNSIGNED") || st.RefusedGeneration != 2 {
		t.Errorf("status %+v", st)
	}
}

// TestEqualGenerationIgnored: a DesiredState for the generation the agent
// holds is ignored even when its content differs (a gateway that reused a
// generation): nothing stored, nothing applied, no refusal recorded. So
// is one below it.
func TestEqualGenerationIgnored(t *testing.T) {
	var log []string
	var mu sync.Mutex
	dir := t.TempDir()
	fh := newFiles(t, "fakehw", &log, &mu)
	e := open(t, dir, fh)
	if err := e.Offer(full(2, `{"fakehw":{"a":"1"}}`), time.Now()); err != nil {
		t.Fatal(err)
	}
	settle(t, e)
	before, _ := os.ReadFile(filepath.Join(dir, SpecFile))
	for _, ds := range []*bcdv1.DesiredState{full(2, `{"fakehw":{"a":"2"}}`), full(1, `{"fakehw":{"a":"3"}}`), patch(2, 1, `{"fakehw":{"b":"4"}}`)} {
		if err := e.Offer(ds, time.Now()); err != nil {
			t.Errorf("generation %d (holding 2): refused (%v), want ignored", ds.GetGeneration(), err)
		}
		settle(t, e)
		after, _ := os.ReadFile(filepath.Join(dir, SpecFile))
		_, raw := e.Spec()
		got, _ := os.ReadFile(filepath.Join(fh.dir, "a"))
		if !bytes.Equal(before, after) || string(raw) != `{"fakehw":{"a":"1"}}` || string(got) != "1" || e.Applied() != 2 {
			t.Errorf("a generation at or below the held one is ignored: generation %d %s (holding 2) left spec %s, stored %s, file a=%q", ds.GetGeneration(), ds.GetSpec(), raw, after, got)
		}
		if st := e.Status(); st.SpecError != "" || st.RefusedGeneration != 0 {
			t.Errorf("generation %d: recorded as refused %+v, want ignored", ds.GetGeneration(), st)
		}
	}
}

// TestObservedWaitsOutBackOff: a pass that runs while a section waits
// out its retry back-off (nothing to do for it yet) does not advance the
// observed generation: the section has not settled.
func TestObservedWaitsOutBackOff(t *testing.T) {
	var log []string
	var mu sync.Mutex
	fh := newFiles(t, "fakehw", &log, &mu)
	fh.failN = 1
	e, err := Open(Config{DataDir: t.TempDir(), Sections: []Section{fh}, RetryBase: time.Hour, RetryMax: time.Hour, Recheck: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Offer(full(1, `{"fakehw":{"a":"1"}}`), time.Now()); err != nil {
		t.Fatal(err)
	}
	e.Pass(context.Background())
	if got := state(e, "fakehw"); got.State != Retrying {
		t.Fatalf("after a failed apply: %+v, want RETRYING", got)
	}
	for i := 0; i < 3; i++ {
		if next := e.Pass(context.Background()); next.IsZero() {
			t.Errorf("pass %d during the back-off: no next pass due", i)
		}
		if e.Observed() != 0 || fh.applies != 1 {
			t.Fatalf("the observed generation advances only when every section settled: observed %d during fakehw's retry back-off (applies %d, %+v)", e.Observed(), fh.applies, state(e, "fakehw"))
		}
	}
}
