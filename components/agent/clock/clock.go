// Package clock keeps an agent's working clock: the highest server time it
// has seen (the mark, persisted in the data directory) carried forward by
// the monotonic clock. A Welcome far behind the mark is refused, and the
// working clock never moves back, so a replayed or rolled-back gateway
// cannot make expired commands look fresh.
package clock

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
)

// MaxBehind is how far a Welcome's server time may lie before the mark.
const MaxBehind = 5 * time.Minute

// File is the mark's file name under the data directory.
const File = "clock.json"

// Clock is safe for concurrent use.
type Clock struct {
	mu       sync.Mutex
	path     string
	mark     time.Time // highest server time accepted, persisted
	base     time.Time // server time at the last accepted Welcome
	baseMono time.Time // local time.Now() (monotonic) at that moment
	last     time.Time // the highest value Now returned
	now      func() time.Time
	// Damaged is set when Open found an unreadable mark file.
	Damaged error
}

type state struct {
	MarkUnixMS int64 `json:"mark_unix_ms"`
}

// Open loads the mark from dir (none yet is fine). An empty dir keeps the
// mark in memory only.
func Open(dir string) (*Clock, error) {
	c := &Clock{now: time.Now}
	if dir == "" {
		return c, nil
	}
	c.path = filepath.Join(dir, File)
	b, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", c.path, err)
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		// Written atomically, so this is damage from outside: start without
		// a mark (the next Welcome sets one) rather than never start.
		c.Damaged = fmt.Errorf("parse %s: %w (starting without a time mark)", c.path, err)
		return c, nil
	}
	c.mark = time.UnixMilli(s.MarkUnixMS)
	return c, nil
}

// Mark returns the highest server time accepted.
func (c *Clock) Mark() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mark
}

// Accept takes the server time of a Welcome. It refuses one more than
// MaxBehind before the mark; otherwise the working clock follows the server
// (never moving back) and the mark is advanced and persisted.
func (c *Clock) Accept(server time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.mark.IsZero() && server.Before(c.mark.Add(-MaxBehind)) {
		return fmt.Errorf("gateway time %s is %s before this agent's time mark %s",
			server.UTC().Format(time.RFC3339), c.mark.Sub(server).Round(time.Second), c.mark.UTC().Format(time.RFC3339))
	}
	c.base, c.baseMono = server, c.now()
	if server.After(c.mark) {
		c.mark = server
		if c.path != "" {
			b, _ := json.Marshal(state{MarkUnixMS: server.UnixMilli()})
			if err := atomicfile.Write(c.path, b, 0o600); err != nil {
				return err
			}
		}
	}
	return nil
}

// Now returns the working clock: the last accepted server time plus the
// monotonic time since, or the local clock before any Welcome; never less
// than the mark or a value it returned before.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var t time.Time
	if c.baseMono.IsZero() {
		t = c.now()
	} else {
		t = c.base.Add(c.now().Sub(c.baseMono))
	}
	if t.Before(c.mark) {
		t = c.mark
	}
	if t.Before(c.last) {
		t = c.last
	}
	c.last = t
	return t
}
