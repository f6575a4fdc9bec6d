package bmckinds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/better-compute/bcd/components/trust/pki"
)

// Drivers are the bcx driver plugins the agent hosts (components/bcx.Host).
// A bmc.* command whose "bmc.driver" is neither empty nor "redfish" goes to
// the hosted driver of that id.
type Drivers interface {
	// Hosts reports whether a pinned plugin provides driver.
	Hosts(driver string) bool
	// Invoke runs operation on driver: config and body are JSON, secrets
	// by name. A driver that is down answers a retryable "unavailable".
	Invoke(ctx context.Context, driver, operation string, config, body []byte, secrets map[string][]byte) ([]byte, error)
}

// bcxDriver reports whether b names a driver other than Redfish.
func bcxDriver(b BMC) bool { return b.Driver != "" && b.Driver != "redfish" }

// driverConfig is the config a driver gets for its BMC.
type driverConfig struct {
	Address string          `json:"address"`
	TLSPin  string          `json:"tls_pin,omitempty"`
	Options json.RawMessage `json:"options,omitempty"`
}

// driverCall is one command's session with a hosted driver.
type driverCall struct {
	*job
	driver  string
	config  []byte
	secrets map[string][]byte
}

// startDriver checks a BMC behind a hosted driver: the driver is hosted,
// the address is an IP inside [site] bmc_networks, the pin (if any) parses
// and no Redfish-only field is set. Only then does it ask the gateway for
// the credentials (and, with newPassword, the new password).
func (c Config) startDriver(ctx context.Context, kind string, b BMC, newPassword bool) (*driverCall, error) {
	if c.Drivers == nil || !c.Drivers.Hosts(b.Driver) {
		return nil, fmt.Errorf("unsupported-driver: driver %q is not hosted by this agent", b.Driver)
	}
	host := b.Address
	if h, _, err := net.SplitHostPort(b.Address); err == nil {
		host = h
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	if ip == nil {
		return nil, errors.New(`body: "bmc.address" must be an IP address with an optional port`)
	}
	addr := b.Address
	if err := c.allowed(ip, addr); err != nil {
		return nil, err
	}
	if b.SPKIPin != "" {
		if _, err := pki.ParsePin(b.SPKIPin); err != nil {
			return nil, fmt.Errorf(`body: "bmc.spki_pin": %w`, err)
		}
	}
	if b.SystemID != "" {
		return nil, errors.New(`body: "bmc.system_id" is for Redfish BMCs`)
	}
	if b.LegacyTLS {
		return nil, errors.New(`body: "bmc.legacy_tls" is for Redfish BMCs`)
	}
	cfg, err := json.Marshal(driverConfig{Address: addr, TLSPin: b.SPKIPin, Options: b.Options})
	if err != nil {
		return nil, fmt.Errorf(`body: "bmc.options": %w`, err)
	}
	d := &driverCall{job: &job{kind: kind, addr: addr}, driver: b.Driver, config: cfg}
	cr, err := fetchCredentials(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, addr, err)
	}
	d.secrets = map[string][]byte{"username": cr.username, "password": cr.password}
	d.job.secrets = append(d.job.secrets, cr.username, cr.password)
	d.scrubs = append(d.scrubs, cr.password)
	if newPassword {
		pw, err := fetchNewPassword(ctx)
		if err != nil {
			return nil, d.fail(fmt.Errorf("%s %s: %w", kind, addr, err))
		}
		if bytes.Equal(pw, cr.password) {
			clear(pw)
			return nil, d.fail(errors.New("the new password is the current one"))
		}
		d.secrets["new_password"] = pw
		d.job.secrets = append(d.job.secrets, pw)
		d.scrubs = append(d.scrubs, pw)
	}
	return d, nil
}

// fail zeroes the secrets of a call that ends before it started.
func (d *driverCall) fail(err error) error {
	_, err = d.finish(context.Background(), nil, err)
	return err
}

// runDriver runs one command's calls against its driver and finishes it
// like a Redfish command: the result and the error scrubbed of every
// secret, the secrets zeroed.
func (c Config) runDriver(ctx context.Context, kind string, b BMC, newPassword bool,
	calls func(call func(op string, body any) (json.RawMessage, error)) (any, error)) (json.RawMessage, error) {
	d, err := c.startDriver(ctx, kind, b, newPassword)
	if err != nil {
		return nil, err
	}
	call := func(op string, body any) (json.RawMessage, error) {
		in, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		out, err := c.Drivers.Invoke(ctx, d.driver, op, d.config, in, d.secrets)
		if err != nil {
			return nil, fmt.Errorf("driver %s: %w", d.driver, err)
		}
		return out, nil
	}
	out, err := calls(call)
	return d.finish(ctx, out, err)
}
