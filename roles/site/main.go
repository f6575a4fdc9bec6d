// Command bcd-site is the site role: the agent beside a site's machines
// (boot server, image cache, BMCs). Its components are wired here.
package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/boot/httpproxy"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/components/agent"
	"github.com/better-compute/bcd/components/agent/agentcmd"
	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/agent/update"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/roles"
	"github.com/better-compute/bcd/components/bcx"
	"github.com/better-compute/bcd/components/bmc/bmckinds"
	"github.com/better-compute/bcd/components/boot/bootlease"
	"github.com/better-compute/bcd/components/boot/bootserver"
	"github.com/better-compute/bcd/components/boot/imagecache"
	"github.com/better-compute/bcd/components/boot/sitekinds"
	"github.com/better-compute/bcd/components/boot/sitespec"
	"github.com/better-compute/bcd/components/machine/doctor"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// machine wires the site's boot lease and, with [boot] listen, its boot
// server and the boot kinds.
func machine(cfg *config.Config, log *slog.Logger) (agentcmd.Machine, error) {
	lease := &bootlease.Lease{}
	site := &sitespec.Section{Lease: lease}
	m := agentcmd.Machine{
		Sections:  []converge.Section{site},
		BootLease: func() (bool, time.Duration) { return lease.Active(), lease.Left() },
		// The site's telemetry is the agent's own metrics (session,
		// journal, certificate).
		Telemetry: &agent.Telemetry{},
	}
	withUpdate(&m, cfg, log)
	networks, err := bmckinds.ParseNetworks(cfg.Site.BMCNetworks)
	if err != nil {
		return m, &agentcmd.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("[site] bmc_networks: %w", err)}
	}
	bc := bmckinds.Config{Networks: networks}
	proxy := httpproxy.Config{Secret: session.CommandSecret}
	for _, n := range networks {
		if p, ok := netipPrefix(n); ok {
			proxy.Networks = append(proxy.Networks, p)
		}
	}
	// beside runs what the site runs next to the agent: the plugin host
	// and, with [boot] listen, the boot server.
	var beside []func(context.Context) error
	if cfg.Plugins.Dir != "" {
		host, err := bcx.New(bcx.Config{Dir: cfg.Plugins.Dir, UIDBase: int(cfg.Plugins.UIDBase), Log: log})
		if err != nil {
			return m, err
		}
		bc.Drivers = host
		// The first Hello waits (briefly) for the plugins' first start, so
		// it lists their drivers.
		m.Drivers = func() []*bcdv1.Driver { host.WaitStarted(15 * time.Second); return host.Drivers() }
		beside = append(beside, host.Run)
	}
	bmc := append(bmckinds.Kinds(bc), proxy.Kind())
	m.Kinds = bmc
	m.Beside = besideAll(beside)
	b := cfg.Boot
	if b.Listen == "" {
		log.Warn("no [boot] listen: this site agent serves no PXE machine")
		return m, nil
	}
	if (b.ProxyDHCP || b.TFTP) && (b.ServerIP == "" || b.URL == "") {
		return m, &agentcmd.ExitError{Code: cli.ExitUsage, Err: errors.New("[boot] proxy_dhcp and tftp need server_ip and url")}
	}
	if _, err := os.Stat(cfg.JoinEncryptionJWKPath()); err != nil {
		return m, fmt.Errorf("[boot] needs %s beside the configuration (the ramdisk joins with it): %w", cfg.JoinEncryptionJWKPath(), err)
	}
	if b.URL == "" {
		return m, &agentcmd.ExitError{Code: cli.ExitUsage, Err: errors.New("[boot] listen needs url (where machines fetch scripts and images)")}
	}
	entries, err := bootserver.OpenEntries(cfg.DataDir)
	if err != nil {
		return m, err
	}
	cacheDir := b.CacheDir
	if cacheDir == "" {
		cacheDir = filepath.Join(cfg.DataDir, "cache")
	}
	var warmer *bootserver.Warmer
	cache, err := imagecache.New(imagecache.Config{Dir: cacheDir, MaxBytes: b.CacheMaxBytes, Client: downloadClient(),
		Log: log.With("component", "imagecache"), Changed: func() {
			if warmer != nil {
				warmer.Report()
			}
		}})
	if err != nil {
		return m, err
	}
	warmer = bootserver.NewWarmer(cache, entries, log.With("component", "cachewarmer"))
	warmer.Keep()
	site.Warmer = warmer
	// The warmer runs beside the agent from before the engine exists.
	var kick atomic.Pointer[func()]
	m.Kicker = func(k func()) { kick.Store(&k) }
	warmer.Changed = func() {
		if k := kick.Load(); k != nil {
			(*k)()
		}
	}
	found := &bootserver.Discoveries{Changed: warmer.Report}
	warmer.Discoveries = found
	srv := &bootserver.Server{Boot: b, Entries: entries, Cache: cache, Lease: lease, Log: log.With("component", "bootserver"),
		Discovered: func(mac net.HardwareAddr, arch string) {
			log.Info("an unprepared machine asked to boot", "component", "bootserver", "mac", mac.String(), "arch", arch)
			found.Saw(mac, arch)
		}}
	m.Kinds = append(bmc, sitekinds.Kinds(sitekinds.Config{Config: cfg, Entries: entries, Cache: cache, Keep: warmer.Keep})...)
	m.ReportSections = warmer.SetPublish
	beside = append(beside, func(ctx context.Context) error {
		go func() { _ = warmer.Run(ctx) }()
		return srv.Run(ctx)
	})
	m.Beside = besideAll(beside)
	return m, nil
}

// netipPrefix is n as a netip.Prefix.
func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// besideAll runs every function of fs until ctx ends or one fails; it
// returns the first error once all have returned.
func besideAll(fs []func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, len(fs))
		for _, f := range fs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := f(ctx); err != nil {
					errs <- err
					cancel()
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
}

func main() {
	// bcd re-executes itself as the plugin sandbox's shim; it is no
	// command for operators, so it is not in the command list.
	if len(os.Args) > 1 && os.Args[1] == bcx.ShimName {
		os.Exit(bcx.Shim(os.Args[2:], os.Stderr))
	}
	roles.Main("site", []cli.Command{
		agentcmd.Agent("site", "site", "run the site agent", machine),
		agentcmd.Join(),
		status.Command(),
		doctor.Command(func(cfg *config.Config, path string) []doctor.Check {
			if cfg == nil {
				return doctor.Base(cfg, path)
			}
			return append(doctor.Base(cfg, path), doctor.Update(cfg, update.Entrypoint), doctor.Telemetry(cfg.DataDir))
		}),
		update.Command(),
	}, nil)
}
