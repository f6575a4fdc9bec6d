package journal

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/journal/wal"
)

// crashChildEnv makes the test binary the child of TestAckedWritesSurviveCrash.
const crashChildEnv = "BCD_JOURNAL_CRASH_CHILD"

// TestAckedWritesSurviveCrash kills a process that writes to the journal
// from many goroutines at a random commit, after the group's records are
// written to the log and before their fdatasync (where a crash or power
// cut loses the group). Every write the child saw return (it prints each
// one at once) must be in the journal when it is opened again: an accept
// that returned, a start, a result.
//
// In the power-cut trials the child also does to the log what a power cut
// does to a write that was not fdatasynced: of the bytes written since the
// last fdatasync, a random part at the start survives and the rest is
// lost (zeroed), then the child is killed. A writer that answered before
// the fdatasync fails these (its callers printed writes that are gone).
func TestAckedWritesSurviveCrash(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		return
	}
	rng := rand.New(rand.NewSource(1))
	for trial := 0; trial < 24; trial++ {
		dir := t.TempDir()
		at := 2 + rng.Intn(40)
		powerCut := trial%2 == 1
		cmd := exec.Command(os.Args[0], "-test.run", "^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, "BCD_JOURNAL_CRASH_AT="+strconv.Itoa(at),
			"BCD_JOURNAL_POWER_CUT="+strconv.FormatBool(powerCut))
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("trial %d: the child was not killed at commit %d: %v\n%s%s", trial, at, err, out.String(), errb.String())
		}
		j := open(t, dir, "crash")
		seen := map[string]int{}
		sc := bufio.NewScanner(&out)
		for sc.Scan() {
			op, id, ok := strings.Cut(sc.Text(), " ")
			if !ok {
				t.Fatalf("trial %d: child said %q", trial, sc.Text())
			}
			seen[id] = max(seen[id], map[string]int{"accepted": 1, "started": 2, "finished": 3}[op])
		}
		if len(seen) == 0 {
			t.Fatalf("trial %d: the child acked nothing before commit %d", trial, at)
		}
		for id, step := range seen {
			e, err := j.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"", Accepted, Running, Done}[step]
			switch {
			case e == nil:
				t.Errorf("trial %d: %s was acked %s but is not in the journal after the crash", trial, id, want)
			case step == 2 && e.State == Accepted, step == 3 && e.State != Done:
				t.Errorf("trial %d: %s was acked %s but the journal holds it %s after the crash", trial, id, want, e.State)
			}
		}
		j.Close()
	}
}

// TestCrashChild is the child process of TestAckedWritesSurviveCrash.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashChildEnv)
	if dir == "" {
		return // only as the child
	}
	at, _ := strconv.Atoi(os.Getenv("BCD_JOURNAL_CRASH_AT"))
	powerCut := os.Getenv("BCD_JOURNAL_POWER_CUT") == "true"
	j, _, err := Open(filepath.Join(dir, File), "crash")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	j.w.beforeCommit = func(int) error {
		if n++; n == at {
			if powerCut {
				l := j.log
				keep := l.Synced() + rand.Int63n(l.Size()-l.Synced()+1)
				f, err := os.OpenFile(l.Path(), os.O_RDWR, 0)
				if err != nil {
					panic(err)
				}
				if _, err := f.WriteAt(make([]byte, l.Size()-keep), keep); err != nil {
					panic(err)
				}
				f.Close()
				// Time for a caller answered too early to print its write.
				time.Sleep(20 * time.Millisecond)
			}
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	}
	var mu sync.Mutex
	say := func(op, id string) { // one write(2) per line, so a kill loses no line that was said
		mu.Lock()
		defer mu.Unlock()
		_, _ = os.Stdout.WriteString(op + " " + id + "\n")
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				id := fmt.Sprintf("g%d_%d", g, i)
				if _, _, err := j.Accept(id, "k", "control", []byte("cmd")); err != nil {
					return
				}
				say("accepted", id)
				if err := j.Start(id); err != nil {
					return
				}
				say("started", id)
				if err := j.Finish(id, []byte("result")); err != nil {
					return
				}
				say("finished", id)
			}
		}()
	}
	wg.Wait()
	t.Fatal("the writers stopped before the crash")
}

// TestFailedCommitAcksNothing fails one commit (as an fsync's EIO would):
// every write in its group gets the error and none of them is in the
// journal afterwards; the writes before and after it are.
func TestFailedCommitAcksNothing(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, "n1")
	eio := errors.New("fdatasync: input/output error")
	var mu sync.Mutex
	n := 0
	j.w.beforeCommit = func(int) error {
		mu.Lock()
		defer mu.Unlock()
		if n++; n == 1 {
			return eio
		}
		return nil
	}
	var wg sync.WaitGroup
	failed := make(chan string, 100)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("c%d", g)
			if _, _, err := j.Accept(id, "k", "control", nil); err != nil {
				if !errors.Is(err, eio) {
					t.Errorf("Accept %s: %v", id, err)
				}
				failed <- id
			}
		}()
	}
	wg.Wait()
	close(failed)
	j.Close()
	j = open(t, dir, "n1")
	defer j.Close()
	nfailed := 0
	for id := range failed {
		nfailed++
		if e, _ := j.Get(id); e != nil {
			t.Errorf("%s: its commit failed, yet it is in the journal", id)
		}
	}
	if nfailed == 0 {
		t.Fatal("no write saw the failed commit")
	}
	all, _ := j.Entries()
	if len(all)+nfailed != 16 {
		t.Fatalf("%d entries and %d failed writes, want 16 in all", len(all), nfailed)
	}
}

// TestFailedWriteInGroup: a write that fails (a start of an unknown
// command) in a group with good writes fails alone; the others commit.
func TestFailedWriteInGroup(t *testing.T) {
	j := open(t, t.TempDir(), "n1")
	defer j.Close()
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("c%d", g)
			if g%4 == 0 {
				if err := j.Start(id); !errors.Is(err, ErrUnknown) {
					t.Errorf("Start of unknown %s: %v", id, err)
				}
				return
			}
			if _, isNew, err := j.Accept(id, "k", "control", nil); err != nil || !isNew {
				t.Errorf("Accept %s: new=%v %v", id, isNew, err)
			}
		}()
	}
	wg.Wait()
	all, _ := j.Entries()
	if len(all) != 24 {
		t.Fatalf("%d entries, want 24", len(all))
	}
}

// TestFailedGroupNotReadAgain: a commit whose fdatasync fails while no new
// log can be started either leaves the failed group's frames, whole and
// with valid checksums, in the log it stays on. They must not come back
// when the journal is opened again (this boot's page cache holds them).
func TestFailedGroupNotReadAgain(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, "n1")
	if _, _, err := j.Accept("before", "k", "control", nil); err != nil {
		t.Fatal(err)
	}
	eio := errors.New("fdatasync: input/output error")
	j.w.beforeCommit = func(int) error { return eio }
	createLog = func(string, uint64, int64) (*wal.Log, error) { return nil, errors.New("no space left on device") }
	defer func() { createLog = wal.Create }()
	if _, _, err := j.Accept("failed", "k", "control", nil); !errors.Is(err, eio) {
		t.Fatalf("Accept on a failing disk: %v", err)
	}
	j.Close()
	createLog = wal.Create
	j = open(t, dir, "n1")
	defer j.Close()
	if e, _ := j.Get("failed"); e != nil {
		t.Fatalf("the failed Accept is in the journal read again: %+v", e)
	}
	if e, _ := j.Get("before"); e == nil {
		t.Fatal("the Accept before the failure is gone")
	}
}

// TestCompactionUnsyncedDirectory: a compaction whose new snapshot was
// renamed into place but whose directory fsync failed may or may not be
// durable, and a restart that finds it removes the old log. No write after
// it may be acked into that old log: here the rotations tried after it
// fail before their rename, so the snapshot in place lacks such a write,
// and the reopen must still find every write that was acked. Once the
// disk works again, the journal takes writes.
func TestCompactionUnsyncedDirectory(t *testing.T) {
	smallLogs(t)
	dir := t.TempDir()
	j := open(t, dir, "n1")
	var broken, renamed atomic.Bool
	broken.Store(true)
	syncDir = func(d string) error {
		if broken.Load() {
			renamed.Store(true) // the only caller renamed a snapshot just before
			return errors.New("fsync: input/output error")
		}
		return wal.SyncDir(d)
	}
	createLog = func(p string, gen uint64, seg int64) (*wal.Log, error) {
		if renamed.Load() && broken.Load() {
			return nil, errors.New("no space left on device")
		}
		return wal.Create(p, gen, seg)
	}
	defer func() { syncDir, createLog = wal.SyncDir, wal.Create }()
	var acked []string
	after := 0
	for i := 0; i < 2000 && after < 5; i++ {
		if renamed.Load() {
			after++
		}
		id := fmt.Sprintf("c%04d", i)
		if _, _, err := j.Accept(id, "k", "control", bytes.Repeat([]byte("x"), 100)); err == nil {
			acked = append(acked, id)
		}
	}
	if !renamed.Load() {
		t.Fatal("no compaction was tried")
	}
	j.Close()
	broken.Store(false)
	j = open(t, dir, "n1")
	defer j.Close()
	for _, id := range acked {
		if e, _ := j.Get(id); e == nil {
			t.Errorf("%s was acked and is gone after a reopen", id)
		}
	}
	if _, _, err := j.Accept("last", "k", "control", nil); err != nil {
		t.Fatalf("an Accept once the disk works: %v", err)
	}
}
