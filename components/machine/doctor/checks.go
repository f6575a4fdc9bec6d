package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/trust/identity"
)

// Base returns the checks every agent host runs, in the order they print:
// config, kvm, iommu, nft, gateway, identity, clock, cgroups, hugepages and
// vfio. With cfg nil (the file did not load) the gateway and identity
// checks, which need it, are left out; the config check says why. The
// role's main adds NVML and Hardware, which need its nvidia-smi and
// inventory backends.
func Base(cfg *config.Config, path string) []Check {
	checks := []Check{Config(path), KVM(), IOMMU(), Nft()}
	if cfg != nil {
		checks = append(checks, Gateway(cfg.Gateway), Identity(cfg.DataDir, time.Now), NodeKey(cfg.DataDir, HostHasTPM()),
			SignedIntent(cfg.DataDir, cfg.JoinSigningKeyPin))
	}
	return append(checks, Clock(), Cgroups(), HugePages(), VFIO())
}

// Config checks that the configuration file at path loads, and warns when
// others can read it or its group can write it (group read, as for the
// root:bcd 0640 of an unprivileged install, is fine).
func Config(path string) Check {
	return Check{Name: "config", Run: func(context.Context) Result {
		r := Result{Name: "config"}
		cfg, err := config.Load(path)
		if err != nil {
			r.Status, r.Detail = Fail, err.Error()
			switch {
			case errors.Is(err, os.ErrNotExist):
				r.Detail += " (bcd join --server writes one)"
			case errors.Is(err, os.ErrPermission):
				r.Detail += " (run bcd doctor as root)"
			}
			return r
		}
		r.Status = OK
		gw := cfg.Gateway
		if gw == "" {
			gw = "(none)"
		}
		site := cfg.Site.Name
		if site == "" {
			site = "(none)"
		}
		r.Detail = fmt.Sprintf("%s: gateway %s, site %s", path, gw, site)
		var problems []string
		if cfg.Gateway == "" {
			problems = append(problems, "no gateway is set, so bcd node cannot start")
		}
		if fi, err := os.Stat(path); err == nil {
			perm := fi.Mode().Perm()
			switch {
			case perm&0o006 != 0 && perm&0o020 != 0:
				problems = append(problems, fmt.Sprintf("others can read it and its group can write it (mode %04o): chmod 0640 %s", perm, path))
			case perm&0o006 != 0:
				problems = append(problems, fmt.Sprintf("others can read it (mode %04o): chmod o-rwx %s", perm, path))
			case perm&0o020 != 0:
				problems = append(problems, fmt.Sprintf("its group can write it (mode %04o): chmod g-w %s", perm, path))
			}
		}
		if len(problems) > 0 {
			r.Status = Warn
			r.Detail += "; " + strings.Join(problems, "; ")
		}
		return r
	}}
}

// resetHint is the way back for an identity that no longer works.
const resetHint = "join again as root: bcd join --reset --yes, then bcd join"

// Identity checks the identity in dataDir: ok with the node, site, role
// and how long its certificate has left; a warning for a node that has not
// joined or an identity this user may not read; a failure for an identity
// that does not load or an expired certificate, with the way back.
func Identity(dataDir string, now func() time.Time) Check {
	if now == nil {
		now = time.Now
	}
	return Check{Name: "identity", Run: func(context.Context) Result {
		r := Result{Name: "identity"}
		a, err := identity.Load(dataDir)
		switch {
		case errors.Is(err, identity.ErrNotJoined):
			r.Status, r.Detail = Warn, fmt.Sprintf("no identity in %s: this node has not joined (run bcd join)", dataDir)
			return r
		case errors.Is(err, os.ErrPermission):
			// Not broken, only not this user's to read.
			r.Status, r.Detail = Warn, fmt.Sprintf("cannot read the identity as this user: %v (run bcd doctor as root or as the user bcd node runs as)", err)
			return r
		case err != nil:
			r.Status, r.Detail = Fail, fmt.Sprintf("the identity does not load: %v; %s", err, resetHint)
			return r
		}
		who := fmt.Sprintf("node %s (site %s, role %s)", a.NodeID, a.Site, a.Role)
		left := a.Cert.NotAfter.Sub(now())
		if left <= 0 {
			r.Status = Fail
			r.Detail = fmt.Sprintf("%s, certificate expired at %s; %s", who, a.Cert.NotAfter.UTC().Format(time.RFC3339), resetHint)
			return r
		}
		r.Status, r.Detail = OK, fmt.Sprintf("%s, certificate valid for %s", who, roundLeft(left))
		return r
	}}
}

// roundLeft rounds a remaining validity to the minute, or to the second
// under a minute.
func roundLeft(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Minute)
}

// GatewayTimeout bounds the gateway check's TCP connect.
const GatewayTimeout = 5 * time.Second

// dialFunc is net.Dialer.DialContext's shape.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Gateway checks that the gateway at gatewayURL (https://host[:port])
// accepts a TCP connection within GatewayTimeout.
func Gateway(gatewayURL string) Check {
	var d net.Dialer
	return gateway(gatewayURL, GatewayTimeout, d.DialContext)
}

func gateway(gatewayURL string, timeout time.Duration, dial dialFunc) Check {
	return Check{Name: "gateway", Run: func(ctx context.Context) Result {
		r := Result{Name: "gateway", Status: Fail}
		addr, err := gatewayAddr(gatewayURL)
		if err != nil {
			r.Detail = err.Error()
			return r
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		begin := time.Now()
		c, err := dial(ctx, "tcp", addr)
		took := time.Since(begin)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
				r.Detail = fmt.Sprintf("%s: no TCP connection within %s: check the network, firewall and gateway in config.toml", addr, timeout)
			} else {
				r.Detail = fmt.Sprintf("%s: TCP connect failed: %v", addr, err)
			}
			return r
		}
		c.Close()
		r.Status, r.Detail = OK, fmt.Sprintf("%s reachable in %s", addr, roundTook(took))
		return r
	}}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// roundTook rounds a connect time to the millisecond, or to the
// microsecond under one.
func roundTook(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

// gatewayAddr is host:port of an https gateway URL, port 443 by default.
// The URL is not echoed: it may carry credentials.
func gatewayAddr(s string) (string, error) {
	if s == "" {
		return "", errors.New("no gateway in config.toml (gateway = \"https://...\")")
	}
	u, err := url.Parse(s)
	if err != nil || u.Hostname() == "" {
		return "", errors.New("the gateway in config.toml is not an https://host[:port] URL")
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}
