// Package base groups the small packages every other domain may use and
// that import nothing of bcd's own: config (config.toml), cli (the
// command frame and exit codes), logging (slog), buildinfo, atomicfile,
// backoff, roles (a role binary's main), nodespec (the NodeSpec envelope
// gateway and agents share), sdnotify (readiness to systemd) and testenv (how a test
// says it cannot run). Nothing here knows what an
// agent, a gateway or a machine is.
package base
