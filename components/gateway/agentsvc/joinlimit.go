package agentsvc

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
)

// The join limiter: a fleet that boots together joins together, and each
// join costs the gateway a token opening (ECDH), a certificate signature
// and two store writes. Past the configured rate a Join is refused at
// once with ResourceExhausted and a retry pushback (grpc-retry-pushback-ms)
// saying when a place frees up, spread over a second so the refused do
// not all come back at the same moment; the agent waits that long plus
// its own jitter (components/trust/join) and does not count the refusal
// as a failed attempt. Sessions already held keep their heartbeats and
// commands flowing meanwhile.

// DefaultJoinRate is the joins a second a gateway admits unless
// configured; a burst of DefaultJoinBurst goes through at once.
const (
	DefaultJoinRate  = 200
	DefaultJoinBurst = 50
)

// joinRate is the configured rate: 0 is the default, below 0 no limit.
func joinRate(configured float64) float64 {
	switch {
	case configured == 0:
		return DefaultJoinRate
	case configured < 0:
		return 0
	}
	return configured
}

// joinSpread is the jitter the gateway adds to a pushback.
const joinSpread = time.Second

// joinLimiter is a token bucket over joins.
type joinLimiter struct {
	mu     sync.Mutex
	rate   float64 // tokens a second; 0: no limit
	burst  float64
	tokens float64
	last   time.Time
	now    func() time.Time
	jitter func(time.Duration) time.Duration
}

func newJoinLimiter(rate float64, burst int, now func() time.Time) *joinLimiter {
	if burst < 1 {
		burst = 1
	}
	return &joinLimiter{rate: rate, burst: float64(burst), tokens: float64(burst), last: now(), now: now,
		jitter: func(d time.Duration) time.Duration { return time.Duration(rand.Int64N(int64(d) + 1)) }}
}

// take spends a place for one join and returns 0, or returns how long the
// caller should wait before trying again (spending nothing).
func (l *joinLimiter) take() time.Duration {
	if l == nil || l.rate <= 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	l.last = now
	if l.tokens >= 1 {
		l.tokens--
		return 0
	}
	wait := time.Duration((1 - l.tokens) / l.rate * float64(time.Second))
	return max(wait, time.Millisecond) + l.jitter(joinSpread)
}

// joinBusy is the refusal of a join past the rate, with its pushback.
func joinBusy(rate float64, wait time.Duration) error {
	err := connect.NewError(connect.CodeResourceExhausted,
		fmt.Errorf("gateway is admitting %g joins a second; retry in %s", rate, wait.Round(time.Millisecond)))
	err.Meta().Set("grpc-retry-pushback-ms", strconv.FormatInt(max(wait.Milliseconds(), 1), 10))
	return err
}
