package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/bcd/components/gateway/store"
)

// writes are what a read-modify-write writes, and the notice sent once
// they are committed (notify.go), in the same round trip.
type writes struct {
	pgx.Batch
	notice *store.Notice
}

// rmw runs one read-modify-write transaction in two round trips, where
// pgx.BeginTxFunc takes four (BEGIN, the locking read, the write,
// COMMIT): BEGIN goes out in one batch with the read (lock, args: one
// record column, under a row lock), the writes in one batch with COMMIT
// and the notice after it. write gets the record (found false without a
// row) and returns the writes, nil for none (the transaction is then
// rolled back, as it is after any error). A session's set-up, a
// heartbeat and a result are each one such transaction, and on two busy
// cores every round trip is a wake-up of both processes.
func (p *PG) rmw(lock string, args []any, write func(rec []byte, found bool) (*writes, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	err = p.rmwOn(ctx, c, lock, args, write)
	if c.Conn().PgConn().TxStatus() != 'I' {
		// Nothing to write, or a failure: released inside a transaction,
		// the connection would be closed by the pool (its row lock with
		// it); end the transaction so the connection is used again.
		rctx, rcancel := context.WithTimeout(context.Background(), opTimeout)
		_, _ = c.Exec(rctx, "ROLLBACK")
		rcancel()
	}
	return err
}

func (p *PG) rmwOn(ctx context.Context, c *pgxpool.Conn, lock string, args []any, write func(rec []byte, found bool) (*writes, error)) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(lock, args...)
	br := c.SendBatch(ctx, b)
	var rec []byte
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&rec)
	}
	found := true
	if errors.Is(err, pgx.ErrNoRows) {
		found, err = false, nil
	}
	if err := errors.Join(err, br.Close()); err != nil {
		return err
	}
	w, err := write(rec, found)
	if err != nil || w == nil {
		return err
	}
	n := w.Len()
	w.Queue("COMMIT")
	if w.notice != nil {
		payload, err := noticePayload(*w.notice)
		if err != nil {
			return err
		}
		// After the COMMIT, in the same round trip: a transaction of its
		// own, which the batch's end commits.
		w.Queue(afterCommit, channel, payload)
	}
	br = c.SendBatch(ctx, &w.Batch)
	for range n {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if err == nil {
		tag, cerr := br.Exec()
		if err = cerr; err == nil && tag.String() != "COMMIT" {
			err = fmt.Errorf("transaction not committed: %s", tag)
		}
	}
	if err == nil && w.notice != nil {
		if _, nerr := br.Exec(); nerr != nil {
			// The writes are committed: the call succeeded, its notice
			// did not go out.
			_ = br.Close()
			p.noticeUnsent(*w.notice, nerr)
			return nil
		}
	}
	return errors.Join(err, br.Close())
}
