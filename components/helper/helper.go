// Package helper is bcd helper, the root half of privilege separation: it
// serves an unprivileged bcd node a few typed operations on a local unix
// socket ([helper] socket) and trusts nothing in them. Each connection is
// checked (SO_PEERCRED: the [helper] user or root; /proc/PID/exe: this
// helper's own binary or [helper] entrypoint), carries one request of the
// wire package's protocol, and is logged. Files are written only through
// the filetable package's kinds and ids, never a path; a firewall ruleset
// only in the shape of bcd's three nftables tables; a GPU reset only for a
// GPU nvidia-smi lists on this host; a systemd slice only named
// bcd-alloc-<id>.slice, with cpulists bounded by the host's CPUs and
// memory nodes. The operations are one table (ops_linux.go).
//
// It links no network, RPC or protobuf code: roles/deps_test.go checks the
// helper role never links net/http, connect, protobuf or gRPC.
package helper

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/logging"
)

// Config is what Serve needs of config.toml.
type Config struct {
	// Socket is [helper] socket: the absolute path the helper listens on.
	Socket string
	// User is [helper] user: the account bcd node runs as.
	User string
	// Entrypoint is [helper] entrypoint: the installed bcd node binary
	// whose processes may call, besides this helper's own binary. Empty:
	// only the helper's own binary.
	Entrypoint string
	// ConfigFile is the configuration file the settings came from; it
	// must be root's and closed to others, or Serve refuses to start. Empty
	// skips that check (tests).
	ConfigFile string
}

// FromConfig takes the helper's settings from a loaded configuration.
func FromConfig(c *config.Config) Config {
	p := c.Path
	if p != "" {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
	}
	return Config{Socket: c.Helper.Socket, User: c.Helper.User, Entrypoint: c.Helper.Entrypoint, ConfigFile: p}
}

// Serve checks its configuration and the host, listens on cfg.Socket and
// serves until ctx ends. It returns an error without listening when a
// check fails; see docs/helper.md for the refusals.
func Serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	return serve(ctx, cfg, log, hostSeams())
}

// Command is `bcd helper --config PATH`.
func Command() cli.Command {
	return cli.Command{Name: "helper", Summary: "serve bcd node's privileged operations (runs as root)", Run: run}
}

func run(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcd", "helper")
	path := fs.String("config", config.DefaultPath, "the configuration file; it must have a [helper] section")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	const prefix = "bcd helper"
	cfg, err := config.Load(*path)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	log, err := logging.New(env.Stderr, cfg.Log.Level, cfg.Log.Format, "helper")
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if err := Serve(ctx, FromConfig(cfg), log); err != nil {
		return cli.Fail(env, prefix, err)
	}
	return cli.ExitOK
}
