package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/gateway/store"
)

// channel is the LISTEN/NOTIFY channel of bcgw's notices.
const channel = "bcgw"

var _ store.Shared = (*PG)(nil)

// maxNotice is PostgreSQL's bound on a notice's payload (under 8000
// bytes).
const maxNotice = 7999

// Notices go out after the writes they tell of are committed, in a
// transaction of their own that PostgreSQL commits without waiting for
// its flush (sendNotice), not with those writes. PostgreSQL serializes
// every transaction that notifies under one database-wide lock, held
// until its commit is flushed (so that notices queue in commit order):
// notifying with the writes made each session set-up, command and
// result wait its turn for a whole flush, one after another, where
// other commits share one flush. A notice needs no durability (a
// listener that was away catches up by reading the store, and the sweep
// covers commands and results), so its own commit need not wait for the
// disk, and holds the lock for microseconds. A notice is still never
// sent for writes rolled back, and a listener that gets it reads them
// committed. What the change gives up: a gateway dying between the
// commit and its notice leaves it unsent, as a failed notice always
// could be; the sweep and a reconnecting listener's catch-up make up for
// it.

// afterCommit sends one notice ($1 the channel, $2 the payload) as a
// transaction of its own committed without waiting for its flush.
const afterCommit = `SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)`

// sendNotice sends the notice n once the caller's writes are committed
// (afterCommit). Its failure does not fail the caller, whose writes are
// stored: it is counted and logged (OnNoticeUnsent).
func (p *PG) sendNotice(n store.Notice) {
	if err := p.Notify(n); err != nil {
		p.noticeUnsent(n, err)
	}
}

// OnNoticeUnsent sets what is told of a notice not sent after its
// writes were committed (bcgw counts and logs it: fleet.NoticeUnsent).
func (p *PG) OnNoticeUnsent(f func(n store.Notice, err error)) { p.unsent.Store(&f) }

func (p *PG) noticeUnsent(n store.Notice, err error) {
	if f := p.unsent.Load(); f != nil {
		(*f)(n, err)
	}
}

// noticePayload is a notice as it travels.
func noticePayload(n store.Notice) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(n); err != nil {
		return "", err
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) > maxNotice {
		return "", fmt.Errorf("a %s notice of %d bytes, more than PostgreSQL carries (%d)", n.Kind, len(b), maxNotice)
	}
	return string(b), nil
}

// Notify sends a notice to every gateway on the database: one statement,
// committed without waiting for its flush (afterCommit).
func (p *PG) Notify(n store.Notice) error {
	payload, err := noticePayload(n)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_, err = p.pool.Exec(ctx, afterCommit, channel, payload)
	return err
}

// Listen listens on its own connection (not the pool's: LISTEN belongs to
// a session) and calls f with each notice until ctx ends (nil) or the
// connection fails (the error; the caller listens again). synced is called
// once the LISTEN is in place.
func (p *PG) Listen(ctx context.Context, f func(store.Notice), synced func()) error {
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	conn, err := pgx.ConnectConfig(cctx, p.conn)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("listen: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `LISTEN `+channel); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("listen: %w", err)
	}
	if synced != nil {
		synced()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("listen: %w", err)
		}
		var x store.Notice
		if json.Unmarshal([]byte(n.Payload), &x) != nil || x.Kind == "" {
			continue // not one of ours
		}
		f(x)
	}
}

// Pending lists commands no node has acked yet, oldest first.
func (p *PG) Pending(nodes []string, limit int) ([]store.Command, error) {
	if len(nodes) == 0 {
		return nil, nil
	}
	var out []store.Command
	err := p.tx(func(ctx context.Context, tx pgx.Tx) (err error) {
		out, err = records[store.Command](ctx, tx, "command", `SELECT id, record FROM commands
			WHERE state = 'pending' AND node_id = ANY($2) ORDER BY created_at, id LIMIT $1`, limit, nodes)
		return err
	})
	return out, err
}

// TouchLease decides the lease under its row lock: the row is made free
// (expired) when missing, then locked, so of two gateways touching a free
// lease at once exactly one grants it.
func (p *PG) TouchLease(name, holder string, now time.Time, ttl time.Duration) (held bool, until time.Time, changed bool, err error) {
	err = p.tx(func(ctx context.Context, tx pgx.Tx) error {
		held, until, changed = false, time.Time{}, false
		if _, err := tx.Exec(ctx, `INSERT INTO leases (name, holder, expires) VALUES ($1, '', 'epoch')
			ON CONFLICT (name) DO NOTHING`, name); err != nil {
			return err
		}
		var cur string
		var exp time.Time
		if err := tx.QueryRow(ctx, `SELECT holder, expires FROM leases WHERE name = $1 FOR UPDATE`, name).Scan(&cur, &exp); err != nil {
			return err
		}
		switch {
		case cur == "" || now.After(exp):
			changed = cur != holder
		case cur != holder:
			return nil
		}
		held, until = true, now.Add(ttl)
		_, err := tx.Exec(ctx, `UPDATE leases SET holder = $2, expires = $3 WHERE name = $1`, name, holder, until)
		return err
	})
	if err != nil {
		return false, time.Time{}, false, err
	}
	return held, until, changed, nil
}

// LeaseHolder returns the lease's holder at now ("" when free or expired).
func (p *PG) LeaseHolder(name string, now time.Time) (string, error) {
	var h string
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		var exp time.Time
		err := tx.QueryRow(ctx, `SELECT holder, expires FROM leases WHERE name = $1`, name).Scan(&h, &exp)
		if err == pgx.ErrNoRows || (err == nil && now.After(exp)) {
			h = ""
			return nil
		}
		return err
	})
	return h, err
}
