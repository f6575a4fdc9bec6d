package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// TouchLease decides under the lease row's lock. Another gateway's
// transaction holds that lock and hands the lease to itself; a TouchLease
// started meanwhile waits for it and then sees the new holder, so it does
// not grant the lease too. (Without the lock it would read the row as it
// was, free, and overwrite the other's grant: two holders.)
func TestTouchLeaseWaitsForTheRowLock(t *testing.T) {
	url := pgtest.Database(t)
	s := open(t, url)
	defer s.Close()
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	// The row exists, free (expired).
	if held, _, _, err := s.TouchLease("boot/site1", "gwA", t0.Add(-time.Hour), time.Second); err != nil || !held {
		t.Fatalf("first touch: %v %v", held, err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM leases WHERE name = 'boot/site1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	type touch struct {
		held bool
		err  error
	}
	done := make(chan touch, 1)
	go func() {
		held, _, _, err := s.TouchLease("boot/site1", "gwB", t0, time.Minute)
		done <- touch{held, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("TouchLease returned (held %v, %v) while another transaction held the row", r.held, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := tx.Exec(ctx, `UPDATE leases SET holder = 'gwC', expires = $1 WHERE name = 'boot/site1'`, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.held {
		t.Errorf("TouchLease after the other's grant: held %v, %v; want not held", r.held, r.err)
	}
	if h, err := s.LeaseHolder("boot/site1", t0); err != nil || h != "gwC" {
		t.Errorf("holder %q (%v), want gwC", h, err)
	}
}
