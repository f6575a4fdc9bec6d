package gateway

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
