package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/bcx"
)

// Operations the driver implements.
const (
	opGetPower      = "power.getPower"
	opSetPower      = "power.setPower"
	opSetBootDevice = "management.setBootDevice"
	opInspect       = "inspect.inspect"
)

// Bounds of one ipmitool run.
const (
	callTimeout = 60 * time.Second
	maxOutput   = 1 << 20
	// IPMI 2.0 passwords are at most 20 bytes.
	maxPassword = 20
)

// cipherSuites are the lanplus cipher suites the driver uses: 17
// (HMAC-SHA256, AES-CBC-128) by default, 3, 8 or 12 where a BMC's
// enrollment options say so.
var cipherSuites = map[int]bool{3: true, 8: true, 12: true, 17: true}

type driver struct {
	ipmitool string // the ipmitool binary
}

func (d *driver) Describe() bcx.Description {
	return bcx.Description{DriverID: "ipmi", Kind: "bmc", Version: buildinfo.Version,
		Operations: []string{opGetPower, opSetPower, opSetBootDevice, opInspect}}
}

// config is what the operation acts on: the BMC.
type config struct {
	Address string  `json:"address"` // IP[:port], port 623 when absent
	TLSPin  string  `json:"tls_pin,omitempty"`
	Options options `json:"options"`
}

type options struct {
	CipherSuite int `json:"cipher_suite,omitempty"` // 3, 8, 12 or 17 (default)
}

// target is a checked BMC with its credentials.
type target struct {
	host, port  string
	cipherSuite int
	username    string
	password    []byte
}

func invalid(format string, a ...any) error {
	return &bcx.Error{Code: "invalid-argument", Message: fmt.Sprintf(format, a...)}
}

// decode decodes b strictly into v (empty b is {}).
func decode(b []byte, v any, what string) error {
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("%s: %v", what, err)
	}
	if dec.More() {
		return invalid("%s: trailing data", what)
	}
	return nil
}

// parseTarget checks the config and the secrets. Errors never quote a
// secret.
func parseTarget(req bcx.Request) (*target, error) {
	var c config
	if err := decode(req.Config, &c, "config"); err != nil {
		return nil, err
	}
	if c.TLSPin != "" {
		return nil, invalid("this BMC is enrolled with a TLS pin, and IPMI has no TLS: drive it over Redfish, or enroll it without a pin for IPMI")
	}
	host, port, err := net.SplitHostPort(c.Address)
	if err != nil {
		host, port = strings.Trim(c.Address, "[]"), "623"
	}
	if net.ParseIP(host) == nil {
		return nil, invalid(`config: "address" must be an IP address with an optional port`)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, invalid(`config: "address" has a bad port`)
	}
	t := &target{host: host, port: port, cipherSuite: 17}
	if c.Options.CipherSuite != 0 {
		if !cipherSuites[c.Options.CipherSuite] {
			return nil, invalid(`config: "options.cipher_suite" must be 3, 8, 12 or 17`)
		}
		t.cipherSuite = c.Options.CipherSuite
	}
	user, pw := req.Secrets["username"], req.Secrets["password"]
	if len(user) == 0 || len(pw) == 0 {
		return nil, invalid(`secrets: "username" and "password" are required`)
	}
	if len(user) > 16 || bytes.ContainsFunc(user, func(r rune) bool { return r < 0x21 || r == 0x7f }) {
		return nil, invalid("secrets: an IPMI user name is 1 to 16 printable bytes")
	}
	if len(pw) > maxPassword || bytes.ContainsAny(pw, "\x00\r\n") {
		return nil, invalid("secrets: an IPMI password is 1 to %d bytes without NUL or line breaks", maxPassword)
	}
	t.username, t.password = string(user), pw
	return t, nil
}

// run runs ipmitool against t with args. The password goes through a pipe
// the child inherits as fd 3 (-f /dev/fd/3); nothing secret is on its
// command line or in its environment.
func (d *driver) run(ctx context.Context, t *target, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	r, w, err := os.Pipe()
	if err != nil {
		return "", fmt.Errorf("pipe: %w", err)
	}
	defer r.Close()
	line := append(bytes.Clone(t.password), '\n')
	_, err = w.Write(line) // far below the pipe's buffer
	clear(line)
	w.Close()
	if err != nil {
		return "", fmt.Errorf("pipe: %w", err)
	}
	argv := append([]string{"-I", "lanplus", "-C", strconv.Itoa(t.cipherSuite), "-H", t.host, "-p", t.port,
		"-U", t.username, "-f", "/dev/fd/3", "-N", "2", "-R", "2"}, args...)
	cmd := exec.CommandContext(ctx, d.ipmitool, argv...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C"}
	cmd.ExtraFiles = []*os.File{r}
	var out, stderr limited
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err = cmd.Run()
	if err != nil {
		msg := printable(strings.TrimSpace(stderr.String()+" "+out.String()), 512)
		msg = strings.ReplaceAll(msg, string(t.password), "[redacted]")
		if ctx.Err() != nil {
			return "", &bcx.Error{Code: "timeout", Message: fmt.Sprintf("ipmitool %s: no answer within %v", strings.Join(args, " "), callTimeout), Retryable: true}
		}
		if strings.Contains(msg, "Unable to establish") || strings.Contains(msg, "Get Auth Capabilities") {
			// ipmitool says the same for an unreachable BMC, refused
			// credentials and a cipher suite the BMC lacks: not retried,
			// so wrong credentials never walk an account into a lockout.
			return "", &bcx.Error{Code: "no-session", Message: fmt.Sprintf("ipmitool %s: no IPMI session (BMC unreachable, credentials refused or cipher suite %d not offered): %s", strings.Join(args, " "), t.cipherSuite, msg)}
		}
		return "", &bcx.Error{Code: "failed", Message: fmt.Sprintf("ipmitool %s: %v: %s", strings.Join(args, " "), err, msg)}
	}
	return out.String(), nil
}

// limited keeps the first maxOutput bytes written to it.
type limited struct{ b bytes.Buffer }

func (l *limited) Write(p []byte) (int, error) {
	if room := maxOutput - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limited) String() string { return l.b.String() }

func (d *driver) Invoke(ctx context.Context, op string, req bcx.Request) (json.RawMessage, error) {
	t, err := parseTarget(req)
	if err != nil {
		return nil, err
	}
	var res any
	switch op {
	case opGetPower:
		if err := decode(req.Body, &struct{}{}, "body"); err != nil {
			return nil, err
		}
		res, err = d.getPower(ctx, t)
	case opSetPower:
		res, err = d.setPower(ctx, t, req.Body)
	case opSetBootDevice:
		res, err = d.setBootDevice(ctx, t, req.Body)
	case opInspect:
		if err := decode(req.Body, &struct{}{}, "body"); err != nil {
			return nil, err
		}
		res, err = d.inspect(ctx, t)
	default:
		return nil, &bcx.Error{Code: bcx.CodeUnsupportedOperation, Message: "bcx-ipmi does not implement " + printable(op, 64)}
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

// PowerState is power.getPower's result.
type PowerState struct {
	PowerState string `json:"power_state"` // On or Off
}

func (d *driver) getPower(ctx context.Context, t *target) (PowerState, error) {
	out, err := d.run(ctx, t, "chassis", "power", "status")
	if err != nil {
		return PowerState{}, err
	}
	s, err := parsePower(out)
	return PowerState{PowerState: s}, err
}

// SetPower is power.setPower's body and result.
type SetPower struct {
	State string `json:"state"` // on, off, cycle, reset, soft
}

func (d *driver) setPower(ctx context.Context, t *target, body []byte) (SetPower, error) {
	var b SetPower
	if err := decode(body, &b, "body"); err != nil {
		return b, err
	}
	switch b.State {
	case "on", "off", "cycle", "reset", "soft":
	default:
		return b, invalid(`body: "state" must be on, off, cycle, reset or soft`)
	}
	_, err := d.run(ctx, t, "chassis", "power", b.State)
	return b, err
}

// BootDevice is management.setBootDevice's body.
type BootDevice struct {
	Device string `json:"device"` // pxe, disk, cd
	Once   bool   `json:"once"`
}

// BootResult is management.setBootDevice's result, as the BMC reports it
// afterwards.
type BootResult struct {
	Device  string `json:"device"`
	Target  string `json:"target"`  // Pxe, Hdd, Cd, None, ...
	Enabled string `json:"enabled"` // Once or Continuous
}

var ipmitoolDevice = map[string]string{"pxe": "pxe", "disk": "disk", "cd": "cdrom"}

func (d *driver) setBootDevice(ctx context.Context, t *target, body []byte) (BootResult, error) {
	var b BootDevice
	if err := decode(body, &b, "body"); err != nil {
		return BootResult{}, err
	}
	dev, ok := ipmitoolDevice[b.Device]
	if !ok {
		return BootResult{}, invalid(`body: "device" must be pxe, disk or cd`)
	}
	args := []string{"chassis", "bootdev", dev}
	if !b.Once {
		args = append(args, "options=persistent")
	}
	if _, err := d.run(ctx, t, args...); err != nil {
		return BootResult{}, err
	}
	out, err := d.run(ctx, t, "chassis", "bootparam", "get", "5")
	if err != nil {
		return BootResult{}, err
	}
	target, enabled, err := parseBootFlags(out)
	return BootResult{Device: b.Device, Target: target, Enabled: enabled}, err
}

// Inventory is inspect.inspect's result.
type Inventory struct {
	System  System            `json:"system"`
	BMC     map[string]string `json:"bmc"`
	FRU     map[string]string `json:"fru"`
	Sensors []Sensor          `json:"sensors"`
	// Errors lists the parts the BMC would not give (no FRU, no SDRs).
	Errors []string `json:"errors,omitempty"`
}

// System is the machine as FRU 0 and the system GUID describe it.
type System struct {
	Manufacturer string `json:"manufacturer,omitempty"`
	Model        string `json:"model,omitempty"`
	Serial       string `json:"serial,omitempty"`
	UUID         string `json:"uuid,omitempty"`
}

func (d *driver) inspect(ctx context.Context, t *target) (Inventory, error) {
	inv := Inventory{BMC: map[string]string{}, FRU: map[string]string{}, Sensors: []Sensor{}}
	out, err := d.run(ctx, t, "mc", "info")
	if err != nil {
		return inv, err // no BMC information: the BMC is not answering
	}
	for _, f := range parseFields(out) {
		if k := bmcKeys[f.key]; k != "" {
			inv.BMC[k] = f.value
		}
	}
	if out, err := d.run(ctx, t, "fru", "print", "0"); err == nil {
		for _, f := range parseFields(out) {
			inv.FRU[f.key] = f.value
		}
		inv.System.Manufacturer = first(inv.FRU, "Product Manufacturer", "Board Mfg")
		inv.System.Model = first(inv.FRU, "Product Name", "Board Product")
		inv.System.Serial = first(inv.FRU, "Product Serial", "Chassis Serial", "Board Serial")
	} else {
		inv.Errors = append(inv.Errors, "fru: "+err.Error())
	}
	if out, err := d.run(ctx, t, "mc", "guid"); err == nil {
		for _, f := range parseFields(out) {
			if f.key == "System GUID" {
				inv.System.UUID, _ = parseUUID(f.value)
			}
		}
	} else {
		inv.Errors = append(inv.Errors, "guid: "+err.Error())
	}
	if out, err := d.run(ctx, t, "sdr", "elist"); err == nil {
		inv.Sensors = parseSDR(out)
	} else {
		inv.Errors = append(inv.Errors, "sensors: "+err.Error())
	}
	return inv, nil
}

var bmcKeys = map[string]string{
	"Device ID": "device_id", "Device Revision": "device_revision", "Firmware Revision": "firmware_revision",
	"IPMI Version": "ipmi_version", "Manufacturer ID": "manufacturer_id", "Manufacturer Name": "manufacturer_name",
	"Product ID": "product_id", "Product Name": "product_name",
}

func first(m map[string]string, keys ...string) string {
	for _, k := range keys {
		if v := m[k]; v != "" {
			return v
		}
	}
	return ""
}

var errUnexpected = errors.New("unexpected ipmitool output")
