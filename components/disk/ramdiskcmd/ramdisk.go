// Package ramdiskcmd is `bcd ramdisk`, the ramdisk role's agent mode, kept
// apart so that other roles do not link the boot parameters.
package ramdiskcmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/components/agent"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/hostinfo"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/agent/transport"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/logging"
	"github.com/better-compute/bcd/components/boot/bootparams"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
)

// Env is what the ramdisk's kinds get from the boot parameters.
type Env struct {
	CacheURL string // bc.cache
	Log      *slog.Logger
	// OSConfig is the config.toml an installed OS gets: the same gateway,
	// pins and site, with the default data_dir. OSJWK is the same
	// join-encryption.jwk.
	OSConfig, OSJWK []byte
}

// Command returns `bcd ramdisk`: inside the PXE ramdisk it reads the bc.*
// boot parameters, joins with the discovery attestor as role ramdisk
// (unless the data directory already holds an identity) and runs the agent
// with the ramdisk's kinds.
func Command(kinds func(Env) []dispatch.Kind) cli.Command {
	return cli.Command{Name: "ramdisk", Summary: "run the ramdisk agent (inside the PXE initramfs)", Run: func(ctx context.Context, env *cli.Env, args []string) int {
		fs := cli.NewFlagSet(env, "bcd", "ramdisk")
		cmdline := fs.String("cmdline", "/proc/cmdline", "where to read the bc.* boot parameters")
		dataDir := fs.String("data-dir", "/run/bcd", "key, identity and journal (tmpfs); the status socket is DATA/bcd.sock")
		if code, ok := cli.Parse(fs, env, args, ""); !ok {
			return code
		}
		b, err := os.ReadFile(*cmdline)
		if err != nil {
			return cli.Usagef(env, "bcd ramdisk: read --cmdline: %v", err)
		}
		p, err := bootparams.Parse(strings.TrimSpace(string(b)))
		if err != nil {
			return cli.Usagef(env, "bcd ramdisk: %v", err)
		}
		if strings.HasPrefix(p.Gateway, "http://") && !buildinfo.FakeHW {
			return cli.Usagef(env, "bcd ramdisk: bc.gateway is http://; a host build only dials https")
		}
		jwk, err := pki.ParsePublicJWK(p.JWK)
		if err != nil {
			return cli.Usagef(env, "bcd ramdisk: bc.jwk: %v", err)
		}
		pub := jwk.Public()
		if err := pki.MatchPin(p.JoinEncryptionPin, pub.Key); err != nil {
			return cli.Fail(env, "bcd ramdisk", errors.New("bc.jwk does not match the join encryption pin"))
		}
		abs, err := filepath.Abs(*dataDir)
		if err != nil {
			return cli.Fail(env, "bcd ramdisk", err)
		}
		cfg := &config.Config{
			Gateway: p.Gateway, GatewayServerName: p.ServerName, ServingCASPKIPin: p.ServingCAPin,
			JoinSigningKeyPin: p.JoinSigningPin, JoinEncryptionKeyPin: p.JoinEncryptionPin, Site: config.Site{Name: p.Site},
			DataDir: abs, SocketPath: filepath.Join(abs, "bcd.sock"), Log: config.Log{Level: "info", Format: "json"},
		}
		log, err := logging.New(env.Stderr, "info", "json", "")
		if err != nil {
			return cli.Fail(env, "bcd ramdisk", err)
		}
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return cli.Fail(env, "bcd ramdisk", err)
		}
		if _, err := identity.Load(abs); errors.Is(err, identity.ErrNotJoined) {
			client, hc, err := transport.Client(transport.Options{URL: cfg.Gateway, ServerName: cfg.GatewayServerName, ServingCASPKIPin: cfg.ServingCASPKIPin})
			if err != nil {
				return cli.Fail(env, "bcd ramdisk", err)
			}
			claims := hostinfo.Claims(abs)
			if h := claims.GetHostname(); h == "" || h == "(none)" || h == "localhost" {
				// A PXE-booted machine has no name of its own yet: name it
				// by its boot MAC, so bcgw nodes shows which machine it is.
				claims.Hostname = "pxe-" + strings.ReplaceAll(p.MAC.String(), ":", "")
			}
			a, err := join.Join(ctx, join.Options{Client: client, Role: "ramdisk", Attestor: "discovery", Token: p.DiscoveryToken,
				Assertion: p.Assertion, EncryptionJWK: jwk, SigningPin: cfg.JoinSigningKeyPin, Claims: claims, DataDir: abs,
				Log: log.With("component", "join")})
			hc.CloseIdleConnections()
			if err != nil {
				return cli.Fail(env, "bcd ramdisk", err)
			}
			log.Info("joined", "component", "join", "node", a.NodeID, "site", a.Site, "role", a.Role, "mac", p.MAC.String())
		} else if err != nil {
			return cli.Fail(env, "bcd ramdisk", err)
		}
		var k []dispatch.Kind
		if kinds != nil {
			osConfig, err := InstalledConfig(&p)
			if err != nil {
				return cli.Fail(env, "bcd ramdisk", err)
			}
			k = kinds(Env{CacheURL: p.CacheURL, Log: log, OSConfig: osConfig, OSJWK: append(append([]byte(nil), p.JWK...), '\n')})
		}
		err = agent.Run(ctx, agent.Config{Config: cfg, Role: "ramdisk", Kinds: k, Version: buildinfo.Version, Log: log})
		switch {
		case err == nil:
			return 0
		case errors.Is(err, session.ErrRevoked):
			fmt.Fprintln(env.Stderr, err)
			return 1
		default:
			return cli.Fail(env, "bcd ramdisk", err)
		}
	}}
}

// InstalledConfig renders the config.toml of an OS a deploy installs from
// the ramdisk's boot parameters: the same gateway, server name, pins and
// site, and the defaults for the rest (data_dir /var/lib/bcd).
func InstalledConfig(p *bootparams.Params) ([]byte, error) {
	c, err := config.Parse(nil, config.DefaultPath)
	if err != nil {
		return nil, err
	}
	c.Gateway, c.GatewayServerName = p.Gateway, p.ServerName
	c.ServingCASPKIPin, c.JoinSigningKeyPin, c.JoinEncryptionKeyPin = p.ServingCAPin, p.JoinSigningPin, p.JoinEncryptionPin
	c.Site.Name = p.Site
	b, err := c.Marshal()
	if err != nil {
		return nil, fmt.Errorf("the installed OS's config.toml: %w", err)
	}
	return b, nil
}
