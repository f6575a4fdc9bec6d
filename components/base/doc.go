// Package base groups the small packages every other domain may use and
// that import nothing of bcd's own: config (config.toml), cli (the
// command frame and exit codes), logging (slog), buildinfo, atomicfile,
// backoff and roles (a role binary's main). Nothing here knows what an
// agent, a gateway or a machine is.
package base
