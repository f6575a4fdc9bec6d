package update

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/better-compute/bcd/components/agent/transport"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/config"
)

// NewManager is the in-process Installer of an agent that owns its
// slots (no [helper]): the slots in SlotsDir(cfg), the release keys of
// [update], this machine's role and architecture, downloads staged in
// data_dir/staging by this uid, and the running binary (exe, at
// version and at this build's release sequence, where the floor starts)
// adopted into slot A before the first update.
func NewManager(cfg *config.Config, role, exe, version string) *Manager {
	s := &Slots{Dir: SlotsDir(cfg)}
	testHooks(s)
	return &Manager{
		Slots: s,
		Pins:  cfg.Update.ReleasePins, Threshold: cfg.Update.Threshold(),
		Role: role, Arch: runtime.GOARCH,
		StagingDir: StagingPath(cfg), Owner: os.Getuid(),
		Adopt: exe, AdoptVersion: version, AdoptSequence: buildinfo.ReleaseSequence(),
	}
}

// StagingPath is where an agent stages downloads: data_dir/staging.
func StagingPath(cfg *config.Config) string { return filepath.Join(cfg.DataDir, StagingDir) }

// CurrentPath is the slots' current link: what a restart executes.
func CurrentPath(cfg *config.Config) string { return filepath.Join(SlotsDir(cfg), Current) }

// NewAgent is self-update in an agent over inst.
func NewAgent(cfg *config.Config, inst Installer, version string, log *slog.Logger) *Agent {
	return &Agent{Installer: inst, StagingDir: StagingPath(cfg), DataDir: cfg.DataDir, Version: version,
		Client: Clients(cfg), Log: log}
}

// Clients returns the HTTP client for a release URL: the gateway's own
// host through its pinned serving CA, any other host through the system
// roots. What is fetched is checked against the signed manifest either
// way; the pin keeps a gateway URL from being answered by anyone else.
func Clients(cfg *config.Config) func(u *url.URL) (*http.Client, error) {
	gw, _ := url.Parse(cfg.Gateway)
	return func(u *url.URL) (*http.Client, error) {
		if gw != nil && u.Host == gw.Host && u.Scheme == "https" {
			return transport.HTTPClient(transport.Options{URL: cfg.Gateway, ServerName: cfg.GatewayServerName, ServingCASPKIPin: cfg.ServingCASPKIPin})
		}
		return http.DefaultClient, nil
	}
}

// Trampoline runs at an agent's start, before anything else: when the
// slots are in use and current names another binary than the one
// running (the package's /usr/bin/bcd that the unit starts, or a slot
// a rollback left), it settles the slots (a swap past its deadline is
// undone) and executes current with the same arguments. It returns
// (nil) when this binary is current's or there are no slots yet; it
// does not return when it executes current.
func Trampoline(ctx context.Context, inst Installer, current string, log *slog.Logger) error {
	if _, err := os.Lstat(current); err != nil {
		return nil
	}
	if v, err := inst.Settle(ctx); err != nil {
		log.Error("settling the self-update slots", "err", err)
	} else if v != "" {
		log.Error("self-update rolled back: the new release did not confirm by its deadline", "version", v)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the running binary: %w", err)
	}
	me, err1 := os.Stat(exe)
	cur, err2 := os.Stat(current)
	if err1 != nil || err2 != nil {
		return errors.Join(err1, err2)
	}
	if os.SameFile(me, cur) {
		return nil
	}
	return Exec(current)
}

// Exec executes bin (current) with this process's arguments and
// environment, keeping its pid (systemd sees no exit).
func Exec(bin string) error {
	args := append([]string{bin}, os.Args[1:]...)
	return fmt.Errorf("executing %s: %w", bin, syscall.Exec(bin, args, os.Environ()))
}

// Entrypoint is the bcd the packages' units start (bcd.service,
// bcd-site.service): the package's binary, which executes the slots'
// current at start once the slots are in use (Trampoline).
const Entrypoint = "/usr/bin/bcd"
