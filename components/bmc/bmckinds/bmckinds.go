// Package bmckinds holds the site role's bmc.* command kinds: power, boot
// device, inspection, CD virtual media, firmware inventory, credential
// rotation and BIOS settings, each its own kind with its own operation
// allowlist, over Redfish (components/bmc/redfish).
//
// A command names the BMC by address and enrolled SPKI pin, never by
// credentials: the kind checks the address against [site] bmc_networks,
// checks the BMC's pin with a TLS handshake, and only then asks the gateway
// for the "bmc-credentials" secret bound to the command (and, for a
// rotation, "bmc-new-password"). Secrets are zeroed when the command ends
// and scrubbed from its result and error.
package bmckinds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/bmc/redfish"
	"github.com/better-compute/bcd/components/trust/pki"
)

// Kind names.
const (
	KindPower             = "bmc.power"
	KindBootDevice        = "bmc.bootDevice"
	KindInspect           = "bmc.inspect"
	KindVirtualMedia      = "bmc.virtualMedia"
	KindFirmwareInventory = "bmc.firmwareInventory"
	KindRotateCredentials = "bmc.rotateCredentials"
	KindBIOS              = "bmc.bios"
)

// Secret names the kinds ask the gateway for.
const (
	CredentialsSecret = "bmc-credentials"  // {"username": "...", "password": "..."}
	NewPasswordSecret = "bmc-new-password" // the new password itself, as bytes
)

// logoutTimeout bounds the session logout after a command, which runs even
// when the command's context has ended.
const logoutTimeout = 10 * time.Second

// Config is what the kinds need.
type Config struct {
	// Networks are the [site] bmc_networks: a command may name only a BMC
	// whose IP address is in one of them. Empty refuses every address.
	Networks []*net.IPNet
	// Timeout bounds each Redfish request (redfish.DefaultTimeout when 0).
	Timeout time.Duration
	// Drivers are the hosted bcx drivers (nil: none); a BMC whose driver
	// is not redfish is driven through them.
	Drivers Drivers
}

// ParseNetworks parses [site] bmc_networks entries: CIDR prefixes, or
// single IP addresses (a /32 or /128).
func ParseNetworks(entries []string) ([]*net.IPNet, error) {
	var out []*net.IPNet
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if _, n, err := net.ParseCIDR(e); err == nil {
			out = append(out, n)
			continue
		}
		ip := net.ParseIP(e)
		if ip == nil {
			return nil, fmt.Errorf("bmc_networks: %q is neither a CIDR prefix nor an IP address", e)
		}
		bits := 128
		if ip4 := ip.To4(); ip4 != nil {
			ip, bits = ip4, 32
		}
		out = append(out, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
	}
	return out, nil
}

// Kinds returns the bmc.* kinds.
func Kinds(c Config) []dispatch.Kind {
	return []dispatch.Kind{
		{Name: KindPower, Lane: dispatch.LaneControl, Resources: bmcResource, Run: c.power},
		{Name: KindBootDevice, Lane: dispatch.LaneControl, Idempotent: true, Resources: bmcResource, Run: c.bootDevice},
		{Name: KindInspect, Lane: dispatch.LaneControl, Idempotent: true, Resources: bmcResource, Run: c.inspect},
		{Name: KindVirtualMedia, Lane: dispatch.LaneControl, Idempotent: true, Resources: bmcResource, Run: c.virtualMedia},
		{Name: KindFirmwareInventory, Lane: dispatch.LaneControl, Idempotent: true, Resources: bmcResource, Run: c.firmwareInventory},
		{Name: KindRotateCredentials, Lane: dispatch.LaneControl, Resources: bmcResource, Run: c.rotateCredentials},
		{Name: KindBIOS, Lane: dispatch.LaneControl, Idempotent: true, Resources: bmcResource, Run: c.bios},
	}
}

// BMC names the BMC a command acts on.
type BMC struct {
	Address  string `json:"address"`             // IP[:port]
	SPKIPin  string `json:"spki_pin"`            // the enrolled pin, sha256/<base64>
	SystemID string `json:"system_id,omitempty"` // /redfish/v1/Systems/<id>; else the first system
	// Driver is "redfish" or empty for Redfish, else the id of a hosted bcx
	// driver (e.g. "ipmi"), which gets address, spki_pin and options as its
	// config.
	Driver string `json:"driver,omitempty"`
	// Options are the BMC's enrollment driver options, for a bcx driver
	// only (bcx-ipmi: {"cipher_suite": 3}).
	Options json.RawMessage `json:"options,omitempty"`
	// LegacyTLS is the enrolment's legacy TLS option (Redfish only): the
	// agent also offers TLS 1.2 with RSA key exchange, which old BMCs
	// need; the pin still applies. The gateway releases the credentials of
	// a BMC for such a command only when the BMC was enrolled with it
	// (bcgw bmc-credentials --legacy-tls).
	LegacyTLS bool `json:"legacy_tls,omitempty"`
}

// bmcResource locks one BMC per address: commands on the same BMC never
// run at the same time.
func bmcResource(b []byte) ([]string, error) {
	var body struct {
		BMC struct {
			Address string `json:"address"`
		} `json:"bmc"`
	}
	_ = json.Unmarshal(b, &body)
	addr, _, err := redfish.NormalizeAddr(body.BMC.Address)
	if err != nil {
		return nil, fmt.Errorf(`body: "bmc.address": %w`, err)
	}
	return []string{"bmc:" + addr}, nil
}

// target checks the Redfish BMC a command names and returns its
// normalized address. It makes no connection.
func (c Config) target(b BMC) (string, error) {
	if bcxDriver(b) {
		return "", fmt.Errorf("unsupported-driver: driver %q is not hosted by this agent", b.Driver)
	}
	addr, host, err := redfish.NormalizeAddr(b.Address)
	if err != nil {
		return "", fmt.Errorf(`body: "bmc.address": %w`, err)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return "", errors.New(`body: "bmc.address" must be an IP address (bmc_networks are checked on addresses, not names)`)
	}
	if err := c.allowed(ip, addr); err != nil {
		return "", err
	}
	if len(b.Options) != 0 {
		return "", errors.New(`body: "bmc.options" is for bcx drivers, not Redfish`)
	}
	if _, err := pki.ParsePin(b.SPKIPin); err != nil {
		return "", fmt.Errorf(`body: "bmc.spki_pin": %w`, err)
	}
	if b.SystemID != "" && !redfish.ValidSystemID(b.SystemID) {
		return "", errors.New(`body: "bmc.system_id" must be one path segment of letters, digits and -._~:`)
	}
	return addr, nil
}

// allowed checks ip against [site] bmc_networks; addr names it in errors.
func (c Config) allowed(ip net.IP, addr string) error {
	if len(c.Networks) == 0 {
		return fmt.Errorf("BMC %s refused: [site] bmc_networks is empty", addr)
	}
	for _, n := range c.Networks {
		if n.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("BMC %s refused: outside [site] bmc_networks", addr)
}

// job is one command's session with its BMC.
type job struct {
	kind    string
	addr    string
	client  *redfish.Client
	secrets [][]byte // zeroed when the command ends
	scrubs  [][]byte // the passwords: scrubbed from results and errors
}

// start checks the target, verifies the BMC's pin with a handshake (no
// request is sent), then fetches the credentials.
func (c Config) start(ctx context.Context, kind string, b BMC) (*job, error) {
	addr, err := c.target(b)
	if err != nil {
		return nil, err
	}
	j := &job{kind: kind, addr: addr, client: &redfish.Client{Addr: addr, SPKIPin: b.SPKIPin, SystemID: b.SystemID,
		Timeout: c.Timeout, LegacyTLS: b.LegacyTLS}}
	if err := j.client.Verify(ctx); err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, addr, err)
	}
	cr, err := fetchCredentials(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, addr, err)
	}
	j.secrets = append(j.secrets, cr.username, cr.password)
	j.scrubs = append(j.scrubs, cr.password)
	j.client.Username, j.client.Password = cr.username, cr.password
	return j, nil
}

// finish logs out, scrubs the result and the error of every secret, and
// zeroes the secrets.
func (j *job) finish(ctx context.Context, out any, err error) (json.RawMessage, error) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), logoutTimeout)
	if j.client != nil {
		_ = j.client.Close(lctx) // a failed logout leaves a session the BMC times out
	}
	cancel()
	defer func() {
		for _, s := range j.secrets {
			clear(s)
		}
	}()
	if err != nil {
		msg := fmt.Sprintf("%s %s: %v", j.kind, j.addr, err)
		if scrubbed := j.scrub([]byte(msg)); !bytes.Equal(scrubbed, []byte(msg)) {
			return nil, errors.New(string(scrubbed))
		}
		return nil, fmt.Errorf("%s %s: %w", j.kind, j.addr, err)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("%s %s: result: %w", j.kind, j.addr, err)
	}
	return j.scrub(b), nil
}

// scrub replaces every password (raw or JSON-escaped) in b.
func (j *job) scrub(b []byte) []byte {
	for _, s := range j.scrubs {
		if len(s) == 0 {
			continue
		}
		esc, plain := jsonEscape(s, true), jsonEscape(s, false)
		for _, form := range [][]byte{s, esc, plain} {
			b = bytes.ReplaceAll(b, form, []byte("[redacted]"))
		}
		clear(esc)
		clear(plain)
	}
	return b
}

type powerBody struct {
	BMC    BMC    `json:"bmc"`
	Action string `json:"action"` // on, off, cycle, status
}

// PowerResult is bmc.power's result.
type PowerResult struct {
	Action     string `json:"action"`
	ResetType  string `json:"reset_type,omitempty"` // empty when nothing was sent
	PowerState string `json:"power_state"`
}

func (c Config) power(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body powerBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	switch body.Action {
	case "on", "off", "cycle", "status":
	default:
		return nil, fmt.Errorf(`body: "action" must be on, off, cycle or status, not %q`, body.Action)
	}
	if bcxDriver(body.BMC) {
		return c.runDriver(ctx, KindPower, body.BMC, false, func(call func(string, any) (json.RawMessage, error)) (any, error) {
			res := PowerResult{Action: body.Action}
			if body.Action != "status" {
				if _, err := call("power.setPower", map[string]string{"state": body.Action}); err != nil {
					return nil, err
				}
			}
			out, err := call("power.getPower", struct{}{})
			if err != nil {
				return nil, err
			}
			var p struct {
				PowerState string `json:"power_state"`
			}
			if err := json.Unmarshal(out, &p); err != nil || p.PowerState == "" {
				return nil, errors.New("the driver's power.getPower result has no power_state")
			}
			res.PowerState = p.PowerState
			return res, nil
		})
	}
	j, err := c.start(ctx, KindPower, body.BMC)
	if err != nil {
		return nil, err
	}
	res := PowerResult{Action: body.Action}
	if body.Action != "status" {
		res.ResetType, err = j.client.SetPower(ctx, body.Action)
	}
	if err == nil {
		res.PowerState, err = j.client.Power(ctx)
	}
	return j.finish(ctx, res, err)
}

type bootBody struct {
	BMC    BMC    `json:"bmc"`
	Device string `json:"device"` // pxe, disk, cd
	Once   bool   `json:"once"`   // false: until changed
}

// BootResult is bmc.bootDevice's result.
type BootResult struct {
	Device  string `json:"device"`
	Target  string `json:"target"`  // the BMC's BootSourceOverrideTarget afterwards
	Enabled string `json:"enabled"` // Once or Continuous
}

func (c Config) bootDevice(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body bootBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	switch body.Device {
	case redfish.BootPXE, redfish.BootDisk, redfish.BootCD:
	default:
		return nil, fmt.Errorf(`body: "device" must be pxe, disk or cd, not %q`, body.Device)
	}
	if bcxDriver(body.BMC) {
		return c.runDriver(ctx, KindBootDevice, body.BMC, false, func(call func(string, any) (json.RawMessage, error)) (any, error) {
			out, err := call("management.setBootDevice", map[string]any{"device": body.Device, "once": body.Once})
			if err != nil {
				return nil, err
			}
			var res BootResult
			if err := json.Unmarshal(out, &res); err != nil {
				return nil, fmt.Errorf("the driver's management.setBootDevice result: %w", err)
			}
			res.Device = body.Device
			return res, nil
		})
	}
	j, err := c.start(ctx, KindBootDevice, body.BMC)
	if err != nil {
		return nil, err
	}
	res := BootResult{Device: body.Device}
	err = j.client.SetBootDevice(ctx, body.Device, body.Once)
	if err == nil {
		res.Target, res.Enabled, err = j.client.BootOverride(ctx)
	}
	return j.finish(ctx, res, err)
}

type bmcOnly struct {
	BMC BMC `json:"bmc"`
}

func (c Config) inspect(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body bmcOnly
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	if bcxDriver(body.BMC) {
		return c.runDriver(ctx, KindInspect, body.BMC, false, func(call func(string, any) (json.RawMessage, error)) (any, error) {
			return call("inspect.inspect", struct{}{})
		})
	}
	j, err := c.start(ctx, KindInspect, body.BMC)
	if err != nil {
		return nil, err
	}
	inv, err := j.client.Inspect(ctx)
	return j.finish(ctx, inv, err)
}

type mediaBody struct {
	BMC      BMC    `json:"bmc"`
	Action   string `json:"action"`              // insert, eject
	ImageURL string `json:"image_url,omitempty"` // insert only
}

// MediaResult is bmc.virtualMedia's result.
type MediaResult struct {
	Action string        `json:"action"`
	Media  redfish.Media `json:"media"`
}

func (c Config) virtualMedia(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body mediaBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	switch body.Action {
	case "insert":
		if err := redfish.ValidImageURL(body.ImageURL); err != nil {
			return nil, fmt.Errorf(`body: "image_url": %w`, err)
		}
	case "eject":
		if body.ImageURL != "" {
			return nil, errors.New(`body: "image_url" is for insert only`)
		}
	default:
		return nil, fmt.Errorf(`body: "action" must be insert or eject, not %q`, body.Action)
	}
	if bcxDriver(body.BMC) {
		return c.runDriver(ctx, KindVirtualMedia, body.BMC, false, func(call func(string, any) (json.RawMessage, error)) (any, error) {
			if body.Action == "insert" {
				return call("virtualMedia.insertMedia", map[string]string{"image_url": body.ImageURL})
			}
			return call("virtualMedia.ejectMedia", struct{}{})
		})
	}
	j, err := c.start(ctx, KindVirtualMedia, body.BMC)
	if err != nil {
		return nil, err
	}
	res := MediaResult{Action: body.Action}
	if body.Action == "insert" {
		err = j.client.InsertMedia(ctx, body.ImageURL)
	} else {
		err = j.client.EjectMedia(ctx)
	}
	if err == nil {
		res.Media, err = j.client.CDMedia(ctx)
	}
	return j.finish(ctx, res, err)
}

// FirmwareResult is bmc.firmwareInventory's result.
type FirmwareResult struct {
	Firmware []redfish.Firmware `json:"firmware"`
}

func (c Config) firmwareInventory(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body bmcOnly
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	if bcxDriver(body.BMC) {
		return c.runDriver(ctx, KindFirmwareInventory, body.BMC, false, func(call func(string, any) (json.RawMessage, error)) (any, error) {
			return call("firmware.getInventory", struct{}{})
		})
	}
	j, err := c.start(ctx, KindFirmwareInventory, body.BMC)
	if err != nil {
		return nil, err
	}
	fw, err := j.client.FirmwareInventory(ctx)
	return j.finish(ctx, FirmwareResult{Firmware: fw}, err)
}

// RotateResult is bmc.rotateCredentials's result.
type RotateResult struct {
	Rotated  bool `json:"rotated"`
	Verified bool `json:"verified"` // a fresh login with the new password worked
}

func (c Config) rotateCredentials(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body bmcOnly
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	if bcxDriver(body.BMC) {
		// The new password reaches the driver as the secret new_password.
		return c.runDriver(ctx, KindRotateCredentials, body.BMC, true, func(call func(string, any) (json.RawMessage, error)) (any, error) {
			return call("credentials.setPassword", struct{}{})
		})
	}
	j, err := c.start(ctx, KindRotateCredentials, body.BMC)
	if err != nil {
		return nil, err
	}
	newPW, err := fetchNewPassword(ctx)
	if err != nil {
		return j.finish(ctx, nil, err)
	}
	j.secrets = append(j.secrets, newPW)
	j.scrubs = append(j.scrubs, newPW)
	if bytes.Equal(newPW, j.client.Password) {
		return j.finish(ctx, nil, errors.New("the new password is the current one"))
	}
	if err := j.client.RotatePassword(ctx, newPW); err != nil {
		return j.finish(ctx, nil, err)
	}
	// Log out of the old session, then prove the new password with a fresh
	// login before the gateway is told to keep it.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), logoutTimeout)
	_ = j.client.Close(lctx)
	cancel()
	check := &redfish.Client{Addr: j.addr, SPKIPin: body.BMC.SPKIPin, SystemID: body.BMC.SystemID, Timeout: c.Timeout,
		LegacyTLS: body.BMC.LegacyTLS, Username: j.client.Username, Password: newPW}
	_, err = check.Power(ctx)
	lctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), logoutTimeout)
	_ = check.Close(lctx)
	cancel()
	if err != nil {
		return j.finish(ctx, nil, fmt.Errorf("the BMC accepted the new password but a login with it failed (the BMC may hold either password now): %w", err))
	}
	return j.finish(ctx, RotateResult{Rotated: true, Verified: true}, nil)
}

type biosBody struct {
	BMC        BMC            `json:"bmc"`
	Action     string         `json:"action"`               // get, set
	Attributes map[string]any `json:"attributes,omitempty"` // set only
}

// BIOSResult is bmc.bios's result: for get the attributes and pending
// changes, for set the attributes staged.
type BIOSResult struct {
	Action string         `json:"action"`
	BIOS   *redfish.BIOS  `json:"bios,omitempty"`
	Staged map[string]any `json:"staged,omitempty"` // applied at the next reset
}

// maxBIOSAttributes bounds the attributes one bmc.bios set may change.
const maxBIOSAttributes = 64

func (c Config) bios(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body biosBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	switch body.Action {
	case "get":
		if body.Attributes != nil {
			return nil, errors.New(`body: "attributes" is for set only`)
		}
	case "set":
		if err := checkAttributes(body.Attributes); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf(`body: "action" must be get or set, not %q`, body.Action)
	}
	if bcxDriver(body.BMC) {
		return c.runDriver(ctx, KindBIOS, body.BMC, false, func(call func(string, any) (json.RawMessage, error)) (any, error) {
			if body.Action == "get" {
				return call("bios.getSettings", struct{}{})
			}
			return call("bios.setSettings", map[string]any{"attributes": body.Attributes})
		})
	}
	j, err := c.start(ctx, KindBIOS, body.BMC)
	if err != nil {
		return nil, err
	}
	res := BIOSResult{Action: body.Action}
	if body.Action == "get" {
		res.BIOS, err = j.client.BIOS(ctx)
	} else if err = j.client.SetBIOS(ctx, body.Attributes); err == nil {
		res.Staged = body.Attributes
	}
	return j.finish(ctx, res, err)
}

func checkAttributes(attrs map[string]any) error {
	if len(attrs) == 0 || len(attrs) > maxBIOSAttributes {
		return fmt.Errorf(`body: "attributes" must name 1 to %d attributes`, maxBIOSAttributes)
	}
	for k, v := range attrs {
		if k == "" || len(k) > 128 || strings.IndexFunc(k, func(r rune) bool {
			return !(r == '_' || r == '.' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
		}) >= 0 {
			return fmt.Errorf(`body: "attributes": %q is not an attribute name`, k)
		}
		switch x := v.(type) {
		case string:
			if len(x) > 1024 {
				return fmt.Errorf(`body: "attributes.%s": longer than 1024 bytes`, k)
			}
		case json.Number, bool, nil:
		default:
			return fmt.Errorf(`body: "attributes.%s" must be a string, number, boolean or null`, k)
		}
	}
	return nil
}
