package agentcmd

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// On a terminal bcd join's retries are one plain line each, with the
// wait and the error, not JSON; debug lines stay away at level info.
func TestJoinLinesForPeople(t *testing.T) {
	var b strings.Builder
	log := slog.New(&lineHandler{w: &b, prefix: "bcd join", level: "info"}).With("component", "join")
	log.Warn("join failed; retrying", "attempt", 2, "retry_in", (1200 * time.Millisecond).String(), "err", errors.New("unavailable: connection refused"))
	log.Debug("not shown")
	want := "bcd join: join failed; retrying: attempt 2, retry in 1.2s: unavailable: connection refused\n"
	if b.String() != want {
		t.Fatalf("got %q\nwant %q", b.String(), want)
	}
}
