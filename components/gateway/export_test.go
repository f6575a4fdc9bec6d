package gateway

import "time"

// WithBoundAside sets cfg's hook that sees the admin socket where it is
// first bound (the external tests cannot reach the field).
func WithBoundAside(cfg Config, f func(path string)) Config {
	cfg.boundAside = f
	return cfg
}

// ListenPrivate is listenPrivate for the tests.
var ListenPrivate = listenPrivate

// SetHealthEvery shortens how often the database is pinged; the returned
// function puts it back.
func SetHealthEvery(d time.Duration) func() {
	old := healthEvery
	healthEvery = d
	return func() { healthEvery = old }
}
