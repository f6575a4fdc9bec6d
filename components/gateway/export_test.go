package gateway

import (
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
)

// WithBoundAside sets cfg's hook that sees the admin socket where it is
// first bound (the external tests cannot reach the field).
func WithBoundAside(cfg Config, f func(path string)) Config {
	cfg.boundAside = f
	return cfg
}

// WithBeforeKeySet sets cfg's hook that runs when the database has no key
// set yet, before the gateway offers its own.
func WithBeforeKeySet(cfg Config, f func()) Config {
	cfg.beforeKeySet = f
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

// KeyFiles is the gateway's key set by file name, as it uses it: from
// the database (unsealed) or from the data directory (the files there).
func (s *Server) KeyFiles() map[string][]byte {
	out := map[string][]byte{}
	for _, name := range sharedKeyFiles {
		if b, err := s.keyFiles.read(name); err == nil {
			out[name] = b
		}
	}
	return out
}

// SharedKeyFiles lists the files of the key set a fleet shares.
var SharedKeyFiles = sharedKeyFiles

// NoteUpgrade is noteUpgrade for the tests: c recorded as its node's
// upgrade, as if it had just been sent.
func (s *Server) NoteUpgrade(c store.Command) { s.noteUpgrade(c) }
