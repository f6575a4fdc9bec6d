package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/gateway"
)

// checkServe checks bcgw serve's flags before anything is made: a refused
// start leaves no data directory, no key and no socket behind.
func checkServe(cfg gateway.Config) error {
	if err := checkHostPort("--listen", cfg.Listen, false); err != nil {
		return err
	}
	if cfg.AdminListen != "" {
		if err := checkHostPort("--admin-listen", cfg.AdminListen, true); err != nil {
			return err
		}
	}
	if cfg.Profile && cfg.MetricsListen == "" {
		return errors.New("--profile serves the profiles on the metrics listener: give --metrics too")
	}
	if cfg.HealthListen != "" {
		if err := checkHostPort("--health", cfg.HealthListen, false); err != nil {
			return err
		}
	}
	if cfg.URL != "" {
		u, err := url.Parse(cfg.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return errors.New("--url must be an https URL with a host (https://NAME[:PORT]), nothing else")
		}
	}
	if cfg.ServerName == "" || strings.ContainsAny(cfg.ServerName, " /:@") {
		return fmt.Errorf("--server-name %q is not a DNS name", cfg.ServerName)
	}
	switch {
	case cfg.MaxSessions < 0:
		return errors.New("--max-sessions must be 0 (no limit) or more")
	case cfg.Pushback < 0:
		return errors.New("--pushback must not be negative")
	case cfg.JoinRate < 0 && cfg.JoinRate != -1:
		return errors.New("--join-rate must be a rate above 0, or -1 for no limit")
	case cfg.CertValidity <= 0:
		return errors.New("--cert-validity must be above 0")
	case cfg.Heartbeat <= 0:
		return errors.New("--heartbeat must be above 0")
	case cfg.LeaseTTL <= 0:
		return errors.New("--lease-ttl must be above 0")
	}
	return nil
}

// checkHostPort checks an IP:PORT (host optional unless loopback is
// required) with a port from 0 to 65535.
func checkHostPort(flag, addr string, loopback bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT", flag, addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%s %q: the port must be 0 to 65535", flag, addr)
	}
	if loopback {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("%s must be a loopback address (127.0.0.1:PORT or [::1]:PORT)", flag)
		}
	}
	return nil
}
