package dispatch

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/quorum"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// startWith runs a dispatcher over a fresh journal; with verify, signed
// intent is enforced under one root, which it returns.
func startWith(t testing.TB, kinds []Kind, verify bool) (*Dispatcher, *ecdsa.PrivateKey) {
	t.Helper()
	root, _ := pki.GenerateKey()
	j, _, err := journal.Open(filepath.Join(t.TempDir(), journal.File), "n1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeID: "n1", Journal: j, Kinds: kinds}
	if verify {
		der, _ := x509.MarshalPKIXPublicKey(root.Public())
		roots, err := intent.ParseRoots([][]byte{der})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Verify = roots.VerifyCommand
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; j.Close() })
	return d, root
}

func waitResult(t testing.TB, d *Dispatcher, id string) *bcdv1.CommandResult {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		for _, r := range d.Unacked() {
			if r.GetCommandId() == id {
				return r
			}
		}
		select {
		case <-d.Notify():
		case <-time.After(5 * time.Millisecond):
		case <-timeout:
			t.Fatalf("no result for %s", id)
		}
	}
}

// TestSignedIntentRefusals: with roots, an unsigned command, one signed by
// another key and one whose signature covers another node are refused
// before anything runs; a root's signature runs; a signed command past
// its deadline is still refused.
func TestSignedIntentRefusals(t *testing.T) {
	var ran atomic.Int32
	d, root := startWith(t, []Kind{{Name: "x.run", Run: func(context.Context, []byte) (json.RawMessage, error) {
		ran.Add(1)
		return nil, nil
	}}}, true)
	other, _ := pki.GenerateKey()
	signed := func(id string, k *ecdsa.PrivateKey, mutate func(*bcdv1.Command)) *bcdv1.Command {
		c := cmd(id, "x.run")
		c.Signature, _ = intent.SignCommand(k, c)
		if mutate != nil {
			mutate(c)
		}
		return c
	}
	for _, tc := range []struct {
		c      *bcdv1.Command
		status string
	}{
		{cmd("unsigned", "x.run"), Unsigned},
		{signed("other-key", other, nil), BadSignature},
		{signed("other-node", root, func(c *bcdv1.Command) { c.NodeId = "n2"; c.Signature, _ = intent.SignCommand(root, c); c.NodeId = "n1" }), BadSignature},
		{signed("late", root, func(c *bcdv1.Command) {
			c.DeadlineUnixMs = time.Now().Add(-time.Second).UnixMilli()
			c.Signature, _ = intent.SignCommand(root, c)
		}), Refused},
		{signed("extended", root, func(c *bcdv1.Command) { c.DeadlineUnixMs += 3600_000 }), BadSignature},
	} {
		if err := d.Deliver(tc.c); err != nil {
			t.Fatal(err)
		}
		if r := waitResult(t, d, tc.c.GetId()); r.GetStatus() != tc.status {
			t.Errorf("%s: %s %q, want %s", tc.c.GetId(), r.GetStatus(), r.GetError(), tc.status)
		}
	}
	if ran.Load() != 0 {
		t.Fatalf("a refused command ran %d times", ran.Load())
	}
	ok := signed("ok", root, nil)
	d.Deliver(ok)
	if r := waitResult(t, d, "ok"); r.GetStatus() != Succeeded || ran.Load() != 1 {
		t.Errorf("a root's command: %v", r)
	}
	if r := waitResult(t, d, "unsigned"); !strings.Contains(r.GetError(), "no signature") {
		t.Errorf("the unsigned refusal does not say why: %q", r.GetError())
	}
}

// BenchmarkSignedIntent is one command's life in the dispatcher (journal
// accept, checks, run, result, three fsyncs) with signed intent enforced
// (ES256 verification), next to the same with an unsigned command and no
// roots, in the same run.
func BenchmarkSignedIntent(b *testing.B) {
	noop := []Kind{{Name: "x.run", Run: func(context.Context, []byte) (json.RawMessage, error) { return nil, nil }}}
	for _, verify := range []bool{false, true} {
		name := "unsigned"
		if verify {
			name = "signed"
		}
		b.Run(name, func(b *testing.B) {
			d, root := startWith(b, noop, verify)
			cmds := make([]*bcdv1.Command, b.N)
			for i := range cmds {
				cmds[i] = cmd(fmt.Sprintf("c%d", i), "x.run")
				if verify {
					cmds[i].Signature, _ = intent.SignCommand(root, cmds[i])
				}
			}
			b.ResetTimer()
			for _, c := range cmds {
				if err := d.Deliver(c); err != nil {
					b.Fatal(err)
				}
				if r := waitResult(b, d, c.GetId()); r.GetStatus() != Succeeded {
					b.Fatalf("%v", r)
				}
				d.Acked([]string{c.GetId()})
			}
		})
	}
	// The verification alone.
	root, _ := pki.GenerateKey()
	der, _ := x509.MarshalPKIXPublicKey(root.Public())
	roots, _ := intent.ParseRoots([][]byte{der})
	c := cmd("v", "x.run")
	c.Signature, _ = intent.SignCommand(root, c)
	b.Run("verify-only", func(b *testing.B) {
		for range b.N {
			if err := roots.VerifyCommand(c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestAdmitOnlyAfterEveryCheck: what Admit spends (a batch leaf) is spent
// only for a command every other check let through, so a refused command
// burns nothing; an Admit refusal is a signed-intent status.
func TestAdmitOnlyAfterEveryCheck(t *testing.T) {
	j, _, err := journal.Open(filepath.Join(t.TempDir(), journal.File), "n1")
	if err != nil {
		t.Fatal(err)
	}
	var admitted []string
	d, err := New(Config{NodeID: "n1", Journal: j, Kinds: []Kind{{Name: "x.run", Run: func(context.Context, []byte) (json.RawMessage, error) { return nil, nil }}},
		Admit: func(c *bcdv1.Command) (func(), error) {
			admitted = append(admitted, c.GetId())
			if c.GetId() == "no-leaf" {
				return nil, fmt.Errorf("%w: no leaf", quorum.ErrUnapproved)
			}
			return nil, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; j.Close() }()
	late := cmd("late", "x.run")
	late.DeadlineUnixMs = time.Now().Add(-time.Second).UnixMilli()
	other := cmd("other", "x.run")
	other.NodeId = "n2"
	for _, c := range []*bcdv1.Command{late, other, cmd("no-leaf", "x.run"), cmd("ok", "x.run")} {
		d.Deliver(c)
	}
	if r := waitResult(t, d, "no-leaf"); r.GetStatus() != BatchUnapproved {
		t.Errorf("an Admit refusal: %v", r)
	}
	if r := waitResult(t, d, "ok"); r.GetStatus() != Succeeded {
		t.Errorf("ok: %v", r)
	}
	if strings.Join(admitted, " ") != "no-leaf ok" {
		t.Errorf("Admit saw %v; refused commands must not reach it", admitted)
	}
}

// TestReplayAfterSweepRefused: a signed command that ran and was acked is
// delivered again after the journal's sweep (its acked ttl over, here 0):
// while its deadline has not passed the id is still known and the command
// does not run twice; once the deadline has passed the sweep forgets it,
// and the replay is refused for its deadline. Signed commands without a
// deadline, or with one beyond intent.MaxDeadline, are refused.
func TestReplayAfterSweepRefused(t *testing.T) {
	var ran atomic.Int32
	d, root := startWith(t, []Kind{{Name: "x.run", Run: func(context.Context, []byte) (json.RawMessage, error) {
		ran.Add(1)
		return nil, nil
	}}}, true)
	signed := func(id string, deadline time.Time) *bcdv1.Command {
		c := cmd(id, "x.run")
		c.DeadlineUnixMs = 0
		if !deadline.IsZero() {
			c.DeadlineUnixMs = deadline.UnixMilli()
		}
		c.Signature, _ = intent.SignCommand(root, c)
		return c
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	c := signed("once", deadline)
	if err := d.Deliver(c); err != nil {
		t.Fatal(err)
	}
	if r := waitResult(t, d, "once"); r.GetStatus() != Succeeded {
		t.Fatalf("first delivery: %v", r)
	}
	d.Acked([]string{"once"})
	if n, err := d.cfg.Journal.Sweep(0); err != nil || n != 0 {
		t.Fatalf("a sweep before the deadline removed %d entries (%v)", n, err)
	}
	if err := d.Deliver(c); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a second run would have started
	if n := ran.Load(); n != 1 || len(d.Unacked()) != 0 {
		t.Fatalf("the replay after the sweep ran: %d runs, unacked %v", n, d.Unacked())
	}
	time.Sleep(time.Until(deadline) + 10*time.Millisecond)
	if n, err := d.cfg.Journal.Sweep(0); err != nil || n != 1 {
		t.Fatalf("a sweep past the deadline removed %d entries (%v), want 1", n, err)
	}
	if err := d.Deliver(c); err != nil {
		t.Fatal(err)
	}
	if r := waitResult(t, d, "once"); r.GetStatus() != Refused || !strings.Contains(r.GetError(), "past its deadline") {
		t.Errorf("the replay after the deadline: %v", r)
	}
	for _, tc := range []struct {
		c       *bcdv1.Command
		status  string
		wantErr string
	}{
		{signed("no-deadline", time.Time{}), Refused, "a signed command must have a deadline"},
		{signed("a-year", time.Now().Add(8760*time.Hour)), Refused, "more than 168h0m0s ahead"},
		{signed("eight-days", time.Now().Add(8*24*time.Hour)), Refused, "more than 168h0m0s ahead"},
		{signed("seven-days", time.Now().Add(intent.MaxDeadline)), Succeeded, ""},
	} {
		if err := d.Deliver(tc.c); err != nil {
			t.Fatal(err)
		}
		if r := waitResult(t, d, tc.c.GetId()); r.GetStatus() != tc.status || !strings.Contains(r.GetError(), tc.wantErr) {
			t.Errorf("%s: %s %q, want %s %q", tc.c.GetId(), r.GetStatus(), r.GetError(), tc.status, tc.wantErr)
		}
	}
	if n := ran.Load(); n != 2 {
		t.Errorf("%d runs, want 2 (once, seven-days)", n)
	}
}
