// Package backoff is how bcd waits before trying again: full-jitter
// exponential back-off, the gateway's grpc-retry-pushback-ms, and a sleep
// that ends with its context.
package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"connectrpc.com/connect"
)

// Full returns a full-jitter delay for attempt n (0-based): uniform in
// (0, min(max, base*2^n)].
func Full(n int, base, maxDelay time.Duration) time.Duration {
	d := base << min(n, 20)
	if d <= 0 || d > maxDelay {
		d = maxDelay
	}
	return time.Duration(rand.Int64N(int64(d)) + 1)
}

// Pushback reads grpc-retry-pushback-ms from a connect error.
func Pushback(err error) (time.Duration, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return 0, false
	}
	v := ce.Meta().Get("grpc-retry-pushback-ms")
	if v == "" {
		return 0, false
	}
	ms, perr := strconv.ParseInt(v, 10, 64)
	if perr != nil || ms < 0 || ms > int64(time.Hour/time.Millisecond) {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// Jitter returns d plus a uniform part of up to half of d: clients told
// the same pushback at the same moment come back spread out.
func Jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d + time.Duration(rand.Int64N(int64(d/2)+1))
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
