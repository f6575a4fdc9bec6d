package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/journal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

type fixture struct {
	t    *testing.T
	dir  string
	j    *journal.Journal
	d    *Dispatcher
	stop context.CancelFunc
	done chan struct{}
}

func start(t *testing.T, dir string, kinds []Kind) *fixture {
	t.Helper()
	j, _, err := journal.Open(filepath.Join(dir, journal.File), "n1")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{NodeID: "n1", Journal: j, Kinds: kinds})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fixture{t: t, dir: dir, j: j, d: d, stop: cancel, done: make(chan struct{})}
	if err := d.Recover(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = d.Run(ctx); close(f.done) }()
	t.Cleanup(f.close)
	return f
}

func (f *fixture) close() {
	if f.stop != nil {
		f.stop()
		<-f.done
		f.j.Close()
		f.stop = nil
	}
}

// result waits for id's stored result (what the session would send).
func (f *fixture) result(id string) *bcdv1.CommandResult {
	f.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		for _, r := range f.d.Unacked() {
			if r.GetCommandId() == id {
				return r
			}
		}
		select {
		case <-f.d.Notify():
		case <-time.After(20 * time.Millisecond):
		case <-timeout:
			f.t.Fatalf("no result for %s", id)
		}
	}
}

func cmd(id, kind string) *bcdv1.Command {
	return &bcdv1.Command{Id: id, NodeId: "n1", Kind: kind, DeadlineUnixMs: time.Now().Add(time.Minute).UnixMilli()}
}

func TestAcceptanceRefusals(t *testing.T) {
	var ran atomic.Int32
	f := start(t, t.TempDir(), []Kind{{Name: "x.run", Run: func(context.Context, []byte) (json.RawMessage, error) {
		ran.Add(1)
		return nil, nil
	}}})
	big := cmd("big", "x.run")
	big.Body = make([]byte, MaxBody+1)
	late := cmd("late", "x.run")
	late.DeadlineUnixMs = time.Now().Add(-time.Second).UnixMilli()
	other := cmd("other", "x.run")
	other.NodeId = "n2"
	for _, tc := range []struct {
		c      *bcdv1.Command
		status string
		reason string
	}{
		{cmd("unk", "site.only"), Unsupported, "not supported"},
		{big, Refused, "more than 1 MiB"},
		{late, Refused, "past its deadline"},
		{other, Refused, "another node"},
	} {
		if err := f.d.Deliver(tc.c); err != nil {
			t.Fatal(err)
		}
		r := f.result(tc.c.GetId())
		if r.GetStatus() != tc.status || !strings.Contains(r.GetError(), tc.reason) {
			t.Errorf("%s: %s %q, want %s %q", tc.c.GetId(), r.GetStatus(), r.GetError(), tc.status, tc.reason)
		}
	}
	if ran.Load() != 0 {
		t.Fatalf("a refused command ran %d times", ran.Load())
	}
	// A body of exactly 1 MiB is fine.
	ok := cmd("ok", "x.run")
	ok.Body = make([]byte, MaxBody)
	f.d.Deliver(ok)
	if r := f.result("ok"); r.GetStatus() != Succeeded {
		t.Fatalf("1 MiB body: %v", r)
	}
}

// TestOnceAcrossRestartAndInterrupted stops the agent while commands run,
// by both ways a command starts: at delivery, accepted and started in one
// journal write (s1, i1, q1 find a worker free), and by its worker after
// it waited in the queue (q2, behind q1 in the one-worker bulk lane).
// After the restart none of them runs again but the idempotent kind's.
func TestOnceAcrossRestartAndInterrupted(t *testing.T) {
	dir := t.TempDir()
	var runs atomic.Int32
	release := make(chan struct{})
	q1done := make(chan struct{})
	kinds := func() []Kind {
		return []Kind{
			{Name: "queued", Lane: LaneBulk, Run: func(ctx context.Context, b []byte) (json.RawMessage, error) {
				runs.Add(1000)
				gate := release
				if CommandID(ctx) == "q1" {
					gate = q1done
				}
				select {
				case <-gate:
				case <-ctx.Done():
				}
				return nil, nil
			}},
			{Name: "side", Run: func(ctx context.Context, b []byte) (json.RawMessage, error) {
				runs.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return json.RawMessage(`"done"`), nil
			}},
			{Name: "idem", Idempotent: true, Run: func(ctx context.Context, b []byte) (json.RawMessage, error) {
				runs.Add(100)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil, nil
			}},
		}
	}
	f := start(t, dir, kinds())
	f.d.Deliver(cmd("s1", "side"))
	f.d.Deliver(cmd("i1", "idem"))
	f.d.Deliver(cmd("q1", "queued"))
	f.d.Deliver(cmd("q2", "queued"))
	if e, _ := f.j.Get("q2"); e == nil || e.State != journal.Accepted {
		t.Fatalf("q2 behind q1 in the bulk lane: %+v, want accepted", e)
	}
	close(q1done)
	deadline := time.Now().Add(5 * time.Second)
	for runs.Load() != 2101 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r := f.result("q1"); r.GetStatus() != Succeeded {
		t.Fatalf("q1: %v", r)
	}
	f.close() // the agent stops while both run
	runs.Store(0)
	close(release)

	f2 := start(t, dir, kinds())
	// The interrupted result waits among the unacked ones, which the
	// session sends after its Welcome.
	got := map[string]*bcdv1.CommandResult{}
	for _, u := range f2.d.Unacked() {
		got[u.GetCommandId()] = u
	}
	for _, id := range []string{"s1", "q2"} {
		if r := got[id]; r.GetStatus() != Interrupted {
			t.Fatalf("%s after restart: %v, want INTERRUPTED", id, r)
		}
	}
	if r := f2.result("i1"); r.GetStatus() != Succeeded {
		t.Fatalf("idempotent i1 after restart: %v", r)
	}
	if runs.Load() != 100 {
		t.Fatalf("runs after restart = %d, want 100 (only the idempotent kind again)", runs.Load())
	}
	// Delivered again: never run again; the stored result is still unacked.
	f2.d.Deliver(cmd("s1", "side"))
	found := false
	for _, r := range f2.d.Unacked() {
		found = found || (r.GetCommandId() == "s1" && r.GetStatus() == Interrupted)
	}
	if !found || runs.Load() != 100 {
		t.Fatalf("redelivered s1: unacked has it %v, runs %d", found, runs.Load())
	}
	f2.d.Acked([]string{"s1", "i1", "q1", "q2"})
	if un := f2.d.Unacked(); len(un) != 0 {
		t.Fatalf("unacked after acks: %v", un)
	}
}

// TestTwoFsyncsPerCommand: a command delivered when a worker is free,
// run, and its result acked costs two fdatasyncs, one at a time
// (docs/delivery.md): its acceptance and start share one, its result
// has one, and the ack none. One more may go to a new log segment.
func TestTwoFsyncsPerCommand(t *testing.T) {
	f := start(t, t.TempDir(), []Kind{{Name: "x.run", Run: func(context.Context, []byte) (json.RawMessage, error) { return nil, nil }}})
	f.d.Deliver(cmd("warm", "x.run"))
	f.result("warm")
	f.d.Acked([]string{"warm"})
	const n = 20
	before := f.j.Stats().Syncs
	for i := range n {
		id := fmt.Sprintf("c%d", i)
		if err := f.d.Deliver(cmd(id, "x.run")); err != nil {
			t.Fatal(err)
		}
		if r := f.result(id); r.GetStatus() != Succeeded {
			t.Fatalf("%s: %v", id, r)
		}
		f.d.Acked([]string{id})
	}
	if syncs := f.j.Stats().Syncs - before; syncs > 2*n+1 {
		t.Fatalf("%d commands, one at a time, issued %d fsyncs, want at most %d", n, syncs, 2*n+1)
	}
	if un, _ := f.j.Unacked(); len(un) != 0 {
		t.Fatalf("unacked in the journal after every ack: %d", len(un))
	}
}

// TestLanes observes the pools: eight slow control commands run four at a
// time, bulk commands one at a time.
func TestLanes(t *testing.T) {
	var mu sync.Mutex
	cur, peak := map[string]int{}, map[string]int{}
	slow := func(lane string) func(context.Context, []byte) (json.RawMessage, error) {
		return func(ctx context.Context, b []byte) (json.RawMessage, error) {
			mu.Lock()
			cur[lane]++
			peak[lane] = max(peak[lane], cur[lane])
			mu.Unlock()
			time.Sleep(150 * time.Millisecond)
			mu.Lock()
			cur[lane]--
			mu.Unlock()
			return nil, nil
		}
	}
	f := start(t, t.TempDir(), []Kind{
		{Name: "c", Lane: LaneControl, Run: slow("control")},
		{Name: "b", Lane: LaneBulk, Run: slow("bulk")},
	})
	var ids []string
	for i := range 8 {
		id := "c" + string(rune('0'+i))
		f.d.Deliver(cmd(id, "c"))
		ids = append(ids, id)
	}
	for i := range 3 {
		id := "b" + string(rune('0'+i))
		f.d.Deliver(cmd(id, "b"))
		ids = append(ids, id)
	}
	for _, id := range ids {
		f.result(id)
	}
	if peak["control"] != 4 || peak["bulk"] != 1 {
		t.Fatalf("peak concurrency control=%d bulk=%d, want 4 and 1", peak["control"], peak["bulk"])
	}
}

func TestResourceLockAndCancel(t *testing.T) {
	var mu sync.Mutex
	holders := 0
	maxHolders := 0
	started := make(chan string, 4)
	f := start(t, t.TempDir(), []Kind{{
		Name:      "gpu.op",
		Resources: func(b []byte) ([]string, error) { return []string{"gpu:" + string(b)}, nil },
		Run: func(ctx context.Context, b []byte) (json.RawMessage, error) {
			mu.Lock()
			holders++
			maxHolders = max(maxHolders, holders)
			mu.Unlock()
			started <- string(b)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			mu.Lock()
			holders--
			mu.Unlock()
			return nil, nil
		},
	}})
	a, b := cmd("a", "gpu.op"), cmd("b", "gpu.op")
	a.Body, b.Body = []byte("0"), []byte("0")
	f.d.Deliver(a)
	f.d.Deliver(b)
	f.result("a")
	f.result("b")
	if maxHolders != 1 {
		t.Fatalf("two commands held gpu:0 at once")
	}
	// Cancel a running command.
	c := cmd("c", "gpu.op")
	c.Body = []byte("1")
	f.d.Deliver(c)
	<-started
	<-started
	<-started
	f.d.Cancel("c", "operator asked")
	if r := f.result("c"); r.GetStatus() != Cancelled || r.GetError() != "operator asked" {
		t.Fatalf("cancelled: %v", r)
	}
}

func TestAfterAckRunsOnceAcked(t *testing.T) {
	acted := make(chan string, 2)
	f := start(t, t.TempDir(), []Kind{
		{Name: "selfend", Run: func(context.Context, []byte) (json.RawMessage, error) { return nil, nil },
			AfterAck: func(id string) { acted <- id }},
		{Name: "selfend-fails", Run: func(context.Context, []byte) (json.RawMessage, error) { return nil, errors.New("no") },
			AfterAck: func(id string) { acted <- id }},
	})
	f.d.Deliver(cmd("a", "selfend"))
	f.d.Deliver(cmd("b", "selfend-fails"))
	f.result("a")
	f.result("b")
	select {
	case id := <-acted:
		t.Fatalf("%s acted before its result was acked", id)
	case <-time.After(100 * time.Millisecond):
	}
	f.d.Acked([]string{"a", "b"})
	select {
	case id := <-acted:
		if id != "a" {
			t.Fatalf("acted for %s", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AfterAck did not run after the ack")
	}
	select {
	case id := <-acted:
		t.Fatalf("a failed command acted: %s", id)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestDecodeBody(t *testing.T) {
	var v struct {
		A int `json:"a"`
	}
	for _, tc := range []struct {
		in string
		ok bool
	}{{`{"a":1}`, true}, {`{"a":1,"b":2}`, false}, {`{"a":1} {}`, false}, {``, false}, {`[]`, false}} {
		if err := DecodeBody([]byte(tc.in), &v); (err == nil) != tc.ok {
			t.Errorf("%q: %v", tc.in, err)
		}
	}
}

// TestFullLaneSpillsToJournal: more commands than a lane's queue holds,
// delivered while its one worker is busy (a gateway handing over the
// backlog of an agent that was down), are all accepted, none refused; they
// run once each, in the order they came, as the queue drains, and the ones
// past the queue wait as ids read back from the journal.
func TestFullLaneSpillsToJournal(t *testing.T) {
	j, _, err := journal.Open(filepath.Join(t.TempDir(), journal.File), "n1")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	release := make(chan struct{})
	var mu sync.Mutex
	var order []string
	kinds := []Kind{{Name: "slow", Lane: LaneBulk, Run: func(ctx context.Context, body []byte) (json.RawMessage, error) {
		<-release
		mu.Lock()
		order = append(order, CommandID(ctx))
		mu.Unlock()
		return nil, nil
	}}}
	const depth, n = 3, 12
	d, err := New(Config{NodeID: "n1", Journal: j, Kinds: kinds, Lanes: map[string]int{LaneControl: 1, LaneBulk: 1}, queueDepth: depth})
	if err != nil {
		t.Fatal(err)
	}
	// Settled before anything is delivered, as the agent does: Run's own
	// Recover, racing the deliveries below, would queue again the
	// commands already accepted by then.
	if err := d.Recover(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	var ids []string
	for i := range n {
		id := fmt.Sprintf("cmd_%02d", i)
		ids = append(ids, id)
		if err := d.Deliver(cmd(id, "slow")); err != nil {
			t.Fatalf("deliver %s: %v", id, err)
		}
	}
	for _, r := range d.Unacked() {
		t.Errorf("%s answered %s (%s) while the lane was busy", r.GetCommandId(), r.GetStatus(), r.GetError())
	}
	if _, queued := d.Jobs(); len(queued) < n-1-depth {
		t.Errorf("%d queued jobs listed, want at least %d", len(queued), n-1-depth)
	}
	close(release)
	f := &fixture{t: t, d: d}
	for _, id := range ids {
		if r := f.result(id); r.GetStatus() != Succeeded {
			t.Errorf("%s: %s (%s)", id, r.GetStatus(), r.GetError())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(order, " ") != strings.Join(ids, " ") {
		t.Errorf("ran %v, want each once in delivery order %v", order, ids)
	}
}
