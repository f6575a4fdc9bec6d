// Package dispatch accepts delivered commands and runs them exactly once:
// each is recorded in the journal before any check or side effect, checked
// in the order docs/delivery.md gives (role allowlist, body size,
// signature, deadline, node id), and run by a fixed pool of workers in its
// lane (control 4, provision 2, bulk 1), under per-resource locks. Results
// are stored in the journal and handed to the session until the gateway
// acks them.
package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/quorum"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Result statuses.
const (
	Succeeded   = "SUCCEEDED"
	Failed      = "FAILED"
	Unsupported = "UNSUPPORTED"
	Refused     = "REFUSED"
	Interrupted = "INTERRUPTED"
	Cancelled   = "CANCELLED"
	// Signed intent: no signature, or one that does not verify under the
	// trust bundle's command-signing roots (components/trust/intent).
	Unsigned     = "UNSIGNED"
	BadSignature = "BAD_SIGNATURE"
	// A destructive command without an approved, unspent batch leaf
	// (components/trust/quorum).
	BatchUnapproved = "BATCH_UNAPPROVED"
)

// Lanes and their default pool sizes.
const (
	LaneControl   = "control"
	LaneProvision = "provision"
	LaneBulk      = "bulk"
)

// DefaultLanes are the fixed pool sizes.
func DefaultLanes() map[string]int {
	return map[string]int{LaneControl: 4, LaneProvision: 2, LaneBulk: 1}
}

// MaxBody is the largest command body accepted.
const MaxBody = 1 << 20

// queueDepth is how many queued commands a lane holds in memory, with
// their bodies. Beyond it, queued commands wait as ids only (the lane's
// spill) and are read back from the journal, where Deliver stored them,
// as the queue drains: a command the journal accepted is never refused for
// want of room in memory (docs/decisions.md).
const queueDepth = 1024

// Kind is one command kind a role runs.
type Kind struct {
	Name string
	Lane string // default control
	// Idempotent kinds run again after a crash interrupted them; others are
	// reported INTERRUPTED.
	Idempotent bool
	// Resources names what the command locks (e.g. "gpu:0", "disk:nvme0n1");
	// commands sharing a resource never run at the same time.
	Resources func(body []byte) ([]string, error)
	Run       func(ctx context.Context, body []byte) (json.RawMessage, error)
	// Recover, when set, decides the result of a command of this kind that
	// was running when the agent stopped (a self-terminating kind such as
	// node.reboot checks that it happened); nil falls back to INTERRUPTED.
	Recover func(e *journal.Entry) *bcdv1.CommandResult
	// AfterAck, when set, runs once the gateway acked a SUCCEEDED result of
	// this kind: a kind whose side effect ends the agent where no journal
	// survives it (boot.kexec in the tmpfs ramdisk) reports first and acts
	// after, so its result is never lost.
	AfterAck func(id string)
}

type idKey struct{}

// CommandID returns the id of the command a Kind's Run is running.
func CommandID(ctx context.Context) string {
	id, _ := ctx.Value(idKey{}).(string)
	return id
}

// WithCommandID returns ctx naming the command a Kind's Run runs, as the
// dispatcher does; tests of kinds use it.
func WithCommandID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, idKey{}, id)
}

// Clock is the agent's working clock.
type Clock interface{ Now() time.Time }

// Config configures a Dispatcher.
type Config struct {
	NodeID  string
	Journal *journal.Journal
	Kinds   []Kind
	Lanes   map[string]int // default DefaultLanes()
	Clock   Clock
	Log     *slog.Logger
	// AckedTTL is how long acked entries stay in the journal (default
	// 24h), and longer for a command whose deadline is later.
	AckedTTL time.Duration
	// Verify, when set, checks a command's signature (signed intent); its
	// error refuses the command as UNSIGNED, BAD_SIGNATURE or
	// BATCH_UNAPPROVED.
	Verify func(*bcdv1.Command) error
	// Admit, when set, is the last word once every check passed, right
	// before the command is queued: it records what must be spent once (a
	// batch leaf). Its error refuses the command as Verify's does. undo
	// would give back what it spent were the command not queued after all;
	// every admitted command is queued (a full lane spills), so the
	// dispatcher does not call it.
	Admit func(*bcdv1.Command) (undo func(), err error)
	// Attest, when set, returns the node's signature of a SUCCEEDED
	// result of kind (nil: none), stored with the result.
	Attest func(kind string, r *bcdv1.CommandResult) []byte

	// queueDepth replaces the package's queueDepth (tests).
	queueDepth int
}

type job struct {
	id   string
	cmd  *bcdv1.Command
	kind Kind
	// started: Deliver gave it a worker and its resources and recorded it
	// accepted and running in one journal write (AcceptStarted); the
	// worker runs it without locking or starting it again.
	started bool
	res     []string // its resources, locked when started
}

// jobState is an accepted command this process holds.
type jobState struct {
	kind, lane string
	started    time.Time // zero while queued
	cancel     context.CancelFunc
}

// Job is a command as Jobs reports it.
type Job struct {
	ID      string
	Kind    string
	Lane    string
	Started time.Time // zero for a queued (deferred) command
}

// Jobs lists the running and the queued commands.
func (d *Dispatcher) Jobs() (running, queued []Job) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, j := range d.running {
		x := Job{ID: id, Kind: j.kind, Lane: j.lane, Started: j.started}
		if j.started.IsZero() {
			queued = append(queued, x)
		} else {
			running = append(running, x)
		}
	}
	sort.Slice(running, func(a, b int) bool { return running[a].Started.Before(running[b].Started) })
	sort.Slice(queued, func(a, b int) bool { return queued[a].ID < queued[b].ID })
	return running, queued
}

type lane struct {
	name  string
	size  int
	queue chan *job
	// started carries the commands Deliver started (job.started); a free
	// worker takes them before the queue.
	started chan *job
	mu      sync.Mutex
	busy    int
	// claimed counts the commands in the lane's channels or running, and
	// the ones Deliver is starting: below size, a worker is free for one
	// more at once.
	claimed int
	// spill holds, oldest first, the ids of queued commands that found
	// the queue full; their commands are in the journal. While it is not
	// empty every new command joins it, so the lane keeps its order.
	spill []string
}

// Dispatcher is safe for concurrent use.
type Dispatcher struct {
	cfg    Config
	log    *slog.Logger
	kinds  map[string]Kind
	lanes  map[string]*lane
	notify chan struct{}

	mu        sync.Mutex
	running   map[string]*jobState // running or queued command ids
	cancelled map[string]string    // queued ids cancelled before they started
	locks     map[string]bool
	lockCond  *sync.Cond
	recovered bool
	// pending holds the results the gateway has not acked (loaded from the
	// journal by Recover, added by finish, removed by Acked).
	pending map[string]*bcdv1.CommandResult
	// afterAck holds the AfterAck hooks of finished commands until acked.
	afterAck map[string]func(string)
}

// New builds a dispatcher; Run starts its workers.
func New(cfg Config) (*Dispatcher, error) {
	if cfg.Journal == nil {
		return nil, errors.New("dispatch: a journal is required")
	}
	if cfg.Lanes == nil {
		cfg.Lanes = DefaultLanes()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.AckedTTL == 0 {
		cfg.AckedTTL = journal.DefaultAckedTTL
	}
	if cfg.queueDepth == 0 {
		cfg.queueDepth = queueDepth
	}
	d := &Dispatcher{
		cfg: cfg, log: cfg.Log.With("component", "dispatch"), kinds: map[string]Kind{}, lanes: map[string]*lane{},
		notify: make(chan struct{}, 1), pending: map[string]*bcdv1.CommandResult{}, afterAck: map[string]func(string){},
		running: map[string]*jobState{}, cancelled: map[string]string{}, locks: map[string]bool{},
	}
	d.lockCond = sync.NewCond(&d.mu)
	for name, n := range cfg.Lanes {
		if n < 1 {
			return nil, fmt.Errorf("dispatch: lane %s needs at least one worker", name)
		}
		d.lanes[name] = &lane{name: name, size: n, queue: make(chan *job, cfg.queueDepth), started: make(chan *job, n)}
	}
	for _, k := range cfg.Kinds {
		if k.Lane == "" {
			k.Lane = LaneControl
		}
		if d.lanes[k.Lane] == nil {
			return nil, fmt.Errorf("dispatch: kind %s names unknown lane %s", k.Name, k.Lane)
		}
		if _, dup := d.kinds[k.Name]; dup {
			return nil, fmt.Errorf("dispatch: kind %s listed twice", k.Name)
		}
		d.kinds[k.Name] = k
	}
	return d, nil
}

// Kinds lists the kinds this dispatcher accepts.
func (d *Dispatcher) Kinds() []string {
	out := make([]string, 0, len(d.kinds))
	for k := range d.kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Notify is signalled whenever a new result is stored; the session then
// sends the Unacked results it has not sent yet. Results are never dropped:
// they stay in the journal and in Unacked until the gateway acks them.
func (d *Dispatcher) Notify() <-chan struct{} { return d.notify }

// Credits reports each lane's free workers.
func (d *Dispatcher) Credits() []*bcdv1.LaneCredit {
	var out []*bcdv1.LaneCredit
	for _, l := range d.lanes {
		l.mu.Lock()
		out = append(out, &bcdv1.LaneCredit{Lane: l.name, Size: uint32(l.size), Free: uint32(l.size - l.busy)})
		l.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lane < out[j].Lane })
	return out
}

// InFlight lists the ids accepted and not finished.
func (d *Dispatcher) InFlight() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.running))
	for id := range d.running {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Recover settles what a previous process left in the journal: a command
// that was running is finished (INTERRUPTED, or its kind's Recover), and
// accepted ones are queued again. Call it before the session delivers
// anything; Run calls it when it was not.
func (d *Dispatcher) Recover() error {
	d.mu.Lock()
	if d.recovered {
		d.mu.Unlock()
		return nil
	}
	d.recovered = true
	d.mu.Unlock()
	torun, err := d.cfg.Journal.Recover(func(kind string) bool { return d.kinds[kind].Idempotent }, d.interrupted)
	if err != nil {
		return fmt.Errorf("dispatch: recover journal: %w", err)
	}
	un, err := d.cfg.Journal.Unacked()
	if err != nil {
		return fmt.Errorf("dispatch: read journal: %w", err)
	}
	d.mu.Lock()
	for _, e := range un {
		if r := decodeResult(e); r != nil {
			d.pending[e.ID] = r
		}
	}
	d.mu.Unlock()
	for _, e := range torun {
		var c bcdv1.Command
		if err := proto.Unmarshal(e.Command, &c); err != nil {
			d.finish(e.ID, &bcdv1.CommandResult{Status: Failed, Error: "journal entry unreadable: " + err.Error()})
			continue
		}
		d.log.Info("command resumed from the journal", "command_id", e.ID, "kind", e.Kind)
		d.enqueue(&c)
	}
	return nil
}

// Run starts the lane workers (after Recover) and sweeps acked entries
// hourly, until ctx ends.
func (d *Dispatcher) Run(ctx context.Context) error {
	if err := d.Recover(); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, l := range d.lanes {
		for range l.size {
			wg.Add(1)
			go func() { defer wg.Done(); d.worker(ctx, l) }()
		}
	}
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-t.C:
			if n, err := d.cfg.Journal.Sweep(d.cfg.AckedTTL); err != nil {
				d.log.Warn("journal sweep failed", "err", err)
			} else if n > 0 {
				d.log.Info("journal swept", "entries", n)
			}
		}
	}
}

func (d *Dispatcher) interrupted(e *journal.Entry) []byte {
	if k, ok := d.kinds[e.Kind]; ok && k.Recover != nil {
		if r := k.Recover(e); r != nil {
			r.CommandId = e.ID
			if r.FinishedUnixMs == 0 {
				r.FinishedUnixMs = d.now().UnixMilli()
			}
			d.log.Info("command settled after the restart it caused", "command_id", e.ID, "kind", e.Kind, "status", r.GetStatus())
			b, _ := proto.Marshal(r)
			return b
		}
	}
	d.log.Warn("command was running when the agent stopped; not run again", "command_id", e.ID, "kind", e.Kind)
	now := d.now().UnixMilli()
	b, _ := proto.Marshal(&bcdv1.CommandResult{CommandId: e.ID, Status: Interrupted,
		Error: "the agent stopped while this command ran; it was not run again", StartedUnixMs: e.StartedAt.UnixMilli(), FinishedUnixMs: now})
	return b
}

func (d *Dispatcher) now() time.Time {
	if d.cfg.Clock != nil {
		return d.cfg.Clock.Now()
	}
	return time.Now()
}

func decodeResult(e *journal.Entry) *bcdv1.CommandResult {
	var r bcdv1.CommandResult
	if proto.Unmarshal(e.Result, &r) != nil {
		return nil
	}
	r.CommandId = e.ID
	return &r
}

// Deliver takes a command from the gateway. It returns once the command is
// in the journal (so the session may ack it); a command seen before is not
// run again.
//
// The checks come first, and change nothing; what the journal then
// records holds their outcome, in one durable write (docs/delivery.md): a
// refused command is accepted with its result; one that can run at once
// (a free worker in its lane, its resources free) is accepted and started;
// any other is accepted and queued, and started by its worker. What must
// be spent once (Admit) is spent only after that write.
func (d *Dispatcher) Deliver(c *bcdv1.Command) error {
	id := c.GetId()
	if id == "" {
		return errors.New("command without an id")
	}
	log := d.log.With("command_id", id, "kind", c.GetKind())
	if e, err := d.cfg.Journal.Get(id); err == nil && e != nil {
		// Its result, once made, goes out with the next Welcome's Unacked.
		log.Info("command delivered again; not run again", "state", e.State)
		return nil
	}
	raw, err := proto.Marshal(c)
	if err != nil {
		return err
	}
	k, known := d.kinds[c.GetKind()]
	var deadline time.Time
	if dl := c.GetDeadlineUnixMs(); dl != 0 {
		deadline = time.UnixMilli(dl)
	}
	now := d.now()
	if status, reason := d.check(c, known, deadline, now); status != "" {
		log.Warn("command refused", "status", status, "reason", reason)
		r := &bcdv1.CommandResult{CommandId: id, Status: status, Error: reason, StartedUnixMs: now.UnixMilli(), FinishedUnixMs: now.UnixMilli()}
		b, err := proto.Marshal(r)
		if err != nil {
			return err
		}
		// The id is kept until the deadline has passed (Sweep), so a
		// command delivered again is known for as long as it could run.
		_, isNew, err := d.cfg.Journal.AcceptFinished(id, c.GetKind(), k.Lane, deadline, b)
		if err != nil {
			return fmt.Errorf("journal accept %s: %w", id, err)
		}
		if isNew {
			d.stored(id, r)
		}
		return nil
	}
	j := &job{id: id, cmd: c, kind: k}
	d.claim(j)
	accept := d.cfg.Journal.AcceptUntil
	if j.started {
		accept = d.cfg.Journal.AcceptStarted
	}
	e, isNew, err := accept(id, c.GetKind(), k.Lane, raw, deadline)
	if err != nil || !isNew {
		d.unclaim(j)
		if err != nil {
			return fmt.Errorf("journal accept %s: %w", id, err)
		}
		log.Info("command delivered again; not run again", "state", e.State)
		return nil
	}
	if d.cfg.Admit != nil {
		// Every admitted command runs or is queued (a full lane spills),
		// so what Admit spent stays spent and its undo is not needed. A
		// crash between the journal write and Admit leaves a started
		// command interrupted, never run: nothing was spent for it.
		if _, err := d.cfg.Admit(c); err != nil {
			d.unclaim(j)
			log.Warn("command refused", "status", intentStatus(err), "reason", err.Error())
			return d.finish(id, &bcdv1.CommandResult{Status: intentStatus(err), Error: err.Error(), StartedUnixMs: now.UnixMilli(), FinishedUnixMs: now.UnixMilli()})
		}
	}
	if j.started {
		d.mu.Lock()
		d.running[id] = &jobState{kind: k.Name, lane: k.Lane}
		d.mu.Unlock()
		d.lanes[k.Lane].started <- j // a worker is free for it (claim)
		return nil
	}
	d.enqueue(c)
	return nil
}

// check is the acceptance checks of docs/delivery.md, in their order; the
// first that fails gives the status and reason the command is refused
// with. It changes nothing.
func (d *Dispatcher) check(c *bcdv1.Command, known bool, deadline, now time.Time) (status, reason string) {
	switch {
	case !known:
		return Unsupported, fmt.Sprintf("kind %q is not supported by this agent", c.GetKind())
	case len(c.GetBody()) > MaxBody:
		return Refused, fmt.Sprintf("command body is %d bytes, more than 1 MiB", len(c.GetBody()))
	}
	if d.cfg.Verify != nil {
		if err := d.cfg.Verify(c); err != nil {
			return intentStatus(err), err.Error()
		}
	}
	switch {
	case c.GetDeadlineUnixMs() != 0 && now.UnixMilli() > c.GetDeadlineUnixMs():
		return Refused, "command is past its deadline"
	case len(c.GetSignature()) > 0 && c.GetDeadlineUnixMs() == 0:
		return Refused, "a signed command must have a deadline"
	case len(c.GetSignature()) > 0 && deadline.Sub(now) > intent.MaxDeadline+intent.DeadlineSkew:
		return Refused, fmt.Sprintf("the command's deadline %s is more than %s ahead (the most a signed command may have)",
			deadline.UTC().Format(time.RFC3339), intent.MaxDeadline)
	case c.GetNodeId() != d.cfg.NodeID:
		return Refused, "command is for another node"
	}
	return "", ""
}

func intentStatus(err error) string {
	switch {
	case errors.Is(err, intent.ErrUnsigned):
		return Unsigned
	case errors.Is(err, quorum.ErrUnapproved):
		return BatchUnapproved
	}
	return BadSignature
}

// claim starts j at delivery when it can run at once: its lane has a
// worker free (nothing spilled, fewer commands claimed than workers) and
// its resources are free, which it then holds. Otherwise j is queued as
// before.
func (d *Dispatcher) claim(j *job) {
	var res []string
	if j.kind.Resources != nil {
		var err error
		if res, err = j.kind.Resources(j.cmd.GetBody()); err != nil {
			return // its worker finishes it FAILED
		}
	}
	l := d.lanes[j.kind.Lane]
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.spill) > 0 || l.claimed >= l.size || !d.tryLock(res) {
		return
	}
	l.claimed++
	j.started, j.res = true, res
}

// unclaim gives back what claim took, for a command that does not run.
func (d *Dispatcher) unclaim(j *job) {
	if !j.started {
		return
	}
	l := d.lanes[j.kind.Lane]
	l.mu.Lock()
	l.claimed--
	l.mu.Unlock()
	d.unlock(j.res)
	j.started = false
}

// enqueue queues an accepted command on its lane: in memory while the
// queue has room and nothing is spilled, else as an id in the lane's spill.
func (d *Dispatcher) enqueue(c *bcdv1.Command) {
	k := d.kinds[c.GetKind()]
	l := d.lanes[k.Lane]
	d.mu.Lock()
	d.running[c.GetId()] = &jobState{kind: k.Name, lane: k.Lane}
	d.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.spill) == 0 {
		select {
		case l.queue <- &job{id: c.GetId(), cmd: c, kind: k}:
			l.claimed++
			return
		default:
		}
	}
	if len(l.spill) == 0 {
		d.log.Warn("lane queue full; queued commands wait in the journal", "lane", l.name, "queue", cap(l.queue))
	}
	l.spill = append(l.spill, c.GetId())
}

// refill moves spilled commands into the lane's queue while it has room,
// reading each back from the journal.
func (d *Dispatcher) refill(l *lane) {
	type bad struct {
		id  string
		err error
	}
	var bads []bad
	l.mu.Lock()
	for len(l.spill) > 0 {
		id := l.spill[0]
		c, err := d.load(id)
		if err != nil {
			bads = append(bads, bad{id, err})
			l.spill = l.spill[1:]
			continue
		}
		select {
		case l.queue <- &job{id: id, cmd: c, kind: d.kinds[c.GetKind()]}:
			l.spill = l.spill[1:]
			l.claimed++
			continue
		default:
		}
		break
	}
	l.mu.Unlock()
	for _, b := range bads {
		d.log.Error("queued command unreadable in the journal", "command_id", b.id, "err", b.err)
		_ = d.finish(b.id, &bcdv1.CommandResult{Status: Failed, Error: "journal entry unreadable: " + b.err.Error()})
	}
}

// load reads an accepted command back from the journal.
func (d *Dispatcher) load(id string) (*bcdv1.Command, error) {
	e, err := d.cfg.Journal.Get(id)
	if err != nil {
		return nil, err
	}
	if e == nil || e.State != journal.Accepted {
		return nil, fmt.Errorf("command %s is no longer accepted in the journal", id)
	}
	var c bcdv1.Command
	if err := proto.Unmarshal(e.Command, &c); err != nil {
		return nil, err
	}
	if _, ok := d.kinds[c.GetKind()]; !ok {
		return nil, fmt.Errorf("command %s is of kind %q, which this agent does not run", id, c.GetKind())
	}
	return &c, nil
}

// Cancel ends a queued or running command; it finishes CANCELLED (a running
// kind sees its context cancelled and decides how to stop).
func (d *Dispatcher) Cancel(id, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	j, ok := d.running[id]
	if !ok {
		return
	}
	if reason == "" {
		reason = "cancelled"
	}
	d.cancelled[id] = reason
	if j.cancel != nil {
		j.cancel()
	}
}

// Unacked lists every stored result the gateway has not acked, oldest
// first.
func (d *Dispatcher) Unacked() []*bcdv1.CommandResult {
	d.mu.Lock()
	out := make([]*bcdv1.CommandResult, 0, len(d.pending))
	for _, r := range d.pending {
		out = append(out, r)
	}
	d.mu.Unlock()
	sort.Slice(out, func(a, b int) bool {
		if out[a].GetFinishedUnixMs() != out[b].GetFinishedUnixMs() {
			return out[a].GetFinishedUnixMs() < out[b].GetFinishedUnixMs()
		}
		return out[a].GetCommandId() < out[b].GetCommandId()
	})
	return out
}

// Acked records the gateway's acks. They are not fdatasynced
// (journal.AckResult): an ack lost to a crash only has the result sent
// again, which the gateway stores once.
func (d *Dispatcher) Acked(ids []string) {
	for _, id := range ids {
		d.cfg.Journal.AckResult(id)
		d.mu.Lock()
		r := d.pending[id]
		delete(d.pending, id)
		after := d.afterAck[id]
		delete(d.afterAck, id)
		d.mu.Unlock()
		if after != nil && r.GetStatus() == Succeeded {
			d.log.Info("acting after the result was acked", "command_id", id)
			go after(id)
		}
	}
}

func (d *Dispatcher) finish(id string, r *bcdv1.CommandResult) error {
	r.CommandId = id
	b, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	if err := d.cfg.Journal.Finish(id, b); err != nil {
		return fmt.Errorf("journal finish %s: %w", id, err)
	}
	d.stored(id, r)
	return nil
}

// stored hands a result the journal holds to the session.
func (d *Dispatcher) stored(id string, r *bcdv1.CommandResult) {
	d.mu.Lock()
	delete(d.running, id)
	delete(d.cancelled, id)
	d.pending[id] = r
	d.mu.Unlock()
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

func (d *Dispatcher) lock(res []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		free := true
		for _, r := range res {
			if d.locks[r] {
				free = false
				break
			}
		}
		if free {
			for _, r := range res {
				d.locks[r] = true
			}
			return
		}
		d.lockCond.Wait()
	}
}

// tryLock takes res if every one is free, without waiting.
func (d *Dispatcher) tryLock(res []string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range res {
		if d.locks[r] {
			return false
		}
	}
	for _, r := range res {
		d.locks[r] = true
	}
	return true
}

func (d *Dispatcher) unlock(res []string) {
	d.mu.Lock()
	for _, r := range res {
		delete(d.locks, r)
	}
	d.mu.Unlock()
	d.lockCond.Broadcast()
}

func (d *Dispatcher) worker(ctx context.Context, l *lane) {
	for {
		var j *job
		select {
		case j = <-l.started: // started at delivery: it comes first
		default:
			select {
			case <-ctx.Done():
				return
			case j = <-l.started:
			case j = <-l.queue:
				d.refill(l)
			}
		}
		l.mu.Lock()
		l.busy++
		l.mu.Unlock()
		d.runJob(ctx, j)
		l.mu.Lock()
		l.busy--
		l.claimed--
		l.mu.Unlock()
	}
}

// startOnce marks j running in the journal unless Deliver did.
func (d *Dispatcher) startOnce(j *job) error {
	if j.started {
		return nil
	}
	return d.cfg.Journal.Start(j.id)
}

func (d *Dispatcher) runJob(ctx context.Context, j *job) {
	log := d.log.With("command_id", j.id, "kind", j.kind.Name)
	res := j.res
	if j.started {
		defer d.unlock(res)
	} else if j.kind.Resources != nil {
		var err error
		if res, err = j.kind.Resources(j.cmd.GetBody()); err != nil {
			_ = d.finish(j.id, &bcdv1.CommandResult{Status: Failed, Error: err.Error()})
			return
		}
	}
	if !j.started {
		d.lock(res)
		defer d.unlock(res)
	}
	cctx, cancel := context.WithCancel(WithCommandID(ctx, j.id))
	defer cancel()
	if dl := j.cmd.GetDeadlineUnixMs(); dl != 0 {
		left := time.UnixMilli(dl).Sub(d.now())
		var c2 context.CancelFunc
		cctx, c2 = context.WithTimeout(cctx, left)
		defer c2()
	}
	d.mu.Lock()
	reason, wasCancelled := d.cancelled[j.id]
	if st := d.running[j.id]; st != nil {
		st.cancel, st.started = cancel, d.now()
	} else {
		d.running[j.id] = &jobState{kind: j.kind.Name, lane: j.kind.Lane, cancel: cancel, started: d.now()}
	}
	d.mu.Unlock()
	start := d.now()
	if wasCancelled {
		_ = d.finish(j.id, &bcdv1.CommandResult{Status: Cancelled, Error: reason, StartedUnixMs: start.UnixMilli(), FinishedUnixMs: start.UnixMilli()})
		return
	}
	if ctx.Err() != nil {
		return // shutting down: it stays accepted (or started: interrupted) for the restart
	}
	// Recorded before the side effect: a crash from here on reports it
	// interrupted instead of running it twice. A command started at
	// delivery was recorded running with its acceptance.
	if err := d.startOnce(j); err != nil {
		log.Error("journal start failed; not running", "err", err)
		return
	}
	log.Info("command started", "lane", j.kind.Lane)
	out, err := j.kind.Run(cctx, j.cmd.GetBody())
	r := &bcdv1.CommandResult{Status: Succeeded, Output: out, StartedUnixMs: start.UnixMilli()}
	d.mu.Lock()
	reason, wasCancelled = d.cancelled[j.id]
	d.mu.Unlock()
	switch {
	case wasCancelled:
		r.Status, r.Error = Cancelled, reason
	case ctx.Err() != nil:
		// The agent is stopping mid-command: leave it running in the
		// journal; the next start reports it interrupted.
		log.Warn("agent stopping while the command ran")
		return
	case err != nil:
		r.Status, r.Error = Failed, err.Error()
	}
	r.FinishedUnixMs = d.now().UnixMilli()
	if d.cfg.Attest != nil && r.Status == Succeeded {
		r.CommandId = j.id
		r.Attestation = d.cfg.Attest(j.kind.Name, r)
	}
	if j.kind.AfterAck != nil && r.Status == Succeeded {
		d.mu.Lock()
		d.afterAck[j.id] = j.kind.AfterAck
		d.mu.Unlock()
	}
	if err := d.finish(j.id, r); err != nil {
		log.Error("storing the result failed", "err", err)
		return
	}
	log.Info("command finished", "status", r.Status)
}
