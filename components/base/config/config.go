// Package config loads, checks and writes bcd's configuration file,
// /etc/bcd/config.toml.
//
// The file is decoded strictly: a key the Config struct does not know is an
// error that names the key, so a misspelt setting never passes silently. Top
// level keys are flat; features that need more settings get their own
// section ([log], [helper], and later [boot], [plugins] and others).
package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// DefaultPath is where bcd reads its configuration unless --config says otherwise.
const DefaultPath = "/etc/bcd/config.toml"

// Defaults applied by Load and Parse to keys the file leaves empty.
const (
	DefaultDataDir    = "/var/lib/bcd"
	DefaultSocketPath = "/run/bcd/bcd.sock"
	DefaultLogLevel   = "info"
	DefaultLogFormat  = "json"
)

// maxFileSize bounds how much of a configuration file is read.
const maxFileSize = 1 << 20

// Config is the contents of config.toml.
type Config struct {
	// Gateway is the https URL of the gateway bcd dials.
	Gateway string `toml:"gateway,omitempty"`
	// GatewayServerName is the TLS server name to expect when the gateway
	// is reached by IP address.
	GatewayServerName string `toml:"gateway_server_name,omitempty"`
	// ServingCASPKIPin pins the gateway's serving CA: sha256/<base64>.
	ServingCASPKIPin string `toml:"serving_ca_spki_pin,omitempty"`
	// JoinSigningKeyPin pins the key that signs JoinResponses: sha256/<base64>.
	JoinSigningKeyPin string `toml:"join_signing_key_pin,omitempty"`
	// JoinEncryptionKeyPin pins the key join tokens are sealed to: sha256/<base64>.
	JoinEncryptionKeyPin string `toml:"join_encryption_key_pin,omitempty"`
	// Site is the [site] section: the site's name, and a site agent's
	// BMC networks.
	Site Site `toml:"site,omitempty"`
	// DataDir holds the node key, identity and journal (default /var/lib/bcd).
	DataDir string `toml:"data_dir,omitempty"`
	// SocketPath is the agent's status socket (default /run/bcd/bcd.sock).
	SocketPath string `toml:"socket_path,omitempty"`
	// Log configures logging.
	Log Log `toml:"log,omitempty"`
	// Helper configures privilege separation with bcd helper.
	Helper Helper `toml:"helper,omitempty"`
	// Access is root's own word on the access section (break-glass SSH).
	Access Access `toml:"access,omitempty"`
	// Host is root's own word on the host section (docs/host.md).
	Host Host `toml:"host,omitempty"`
	// Instances is root's word on the instances' runtime (docs/instances.md).
	Instances Instances `toml:"instances,omitempty"`
	// IMDS is the instances' metadata service (docs/instances.md).
	IMDS IMDS `toml:"imds,omitempty"`
	// Boot configures a site agent's boot server.
	Boot Boot `toml:"boot,omitempty"`
	// Plugins configures the bcx driver plugins a site agent hosts.
	Plugins Plugins `toml:"plugins,omitempty"`
	// Intent configures signed intent's destructive-batch quorum.
	Intent Intent `toml:"intent,omitempty"`
	// Update configures self-update: the release keys and the slots.
	Update Update `toml:"update,omitempty"`
	// WebSocket is the fallback through a proxy that strips client
	// certificates (docs/protocol.md#the-websocket-fallback).
	WebSocket WebSocket `toml:"websocket,omitempty"`

	// Path is the file the configuration was loaded from; it is not a key.
	Path string `toml:"-"`
}

// WebSocket is the [websocket] section.
type WebSocket struct {
	// URL, when set, is wss://HOST[:PORT]/v1/session: join, the session
	// and renewals then go through it instead of gateway.
	URL string `toml:"url,omitempty"`
	// CAFile, when set, is a PEM file of the CAs that may sign the TLS
	// certificate the URL's host presents (a proxy's); unset, the
	// system's roots. The gateway's own proof is checked either way.
	CAFile string `toml:"ca_file,omitempty"`
}

// Log is the [log] section.
type Log struct {
	// Level is debug, info (default), warn or error.
	Level string `toml:"level,omitempty"`
	// Format is json (default) or text.
	Format string `toml:"format,omitempty"`
}

// Helper is the [helper] section.
type Helper struct {
	// Socket is the absolute path of the helper's unix socket.
	Socket string `toml:"socket,omitempty"`
	// User is the unprivileged account bcd node runs as under the helper.
	User string `toml:"user,omitempty"`
	// Entrypoint is the absolute path of the installed bcd node binary:
	// bcd helper accepts calls from processes running it (or the helper's
	// own binary), and refuses to start unless it is root's alone.
	Entrypoint string `toml:"entrypoint,omitempty"`
	// StateDir is root's directory for the helper's trust anchors: the
	// join record bcd join writes, the trust bundle and the generations
	// root applied (default /var/lib/bcd-helper).
	StateDir string `toml:"state_dir,omitempty"`
	// CommandRootSHA256 pins, as hex SHA-256 of each key's SPKI DER, the
	// only command-signing roots whose signed specs root applies; unset,
	// root takes the roots of the trust bundle the join-signing key signs.
	CommandRootSHA256 []string `toml:"command_root_sha256,omitempty"`
}

// HelperStateDir is the default [helper] state_dir.
const HelperStateDir = "/var/lib/bcd-helper"

// StateDirOrDefault is [helper] state_dir, else HelperStateDir.
func (h Helper) StateDirOrDefault() string {
	if h.StateDir != "" {
		return h.StateDir
	}
	return HelperStateDir
}

// Load reads the configuration file at path, decodes it strictly, applies
// defaults and validates it. A missing file gives an error that wraps
// fs.ErrNotExist.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading config %s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("reading config %s: larger than %d bytes", path, maxFileSize)
	}
	return Parse(data, path)
}

// Parse decodes data strictly, applies defaults and validates the result.
// path names the file in errors and becomes Config.Path.
func Parse(data []byte, path string) (*Config, error) {
	name := path
	if name == "" {
		name = "config.toml"
	}
	var c Config
	md, err := toml.Decode(string(data), &c)
	if err != nil {
		// After a syntax error md is empty. After a type error, an
		// unknown key such as gateway.url (a table where a string
		// belongs) is the likelier mistake, so report that first.
		// Decoding stopped part way, so only the spelling of each key
		// is checked, not MetaData.Undecoded.
		if unknown := unknownKeys(md, false); len(unknown) > 0 {
			return nil, unknownKeyError(name, unknown)
		}
		return nil, &decodeError{file: name, msg: strings.TrimPrefix(err.Error(), "toml: "), err: err}
	}
	if unknown := unknownKeys(md, true); len(unknown) > 0 {
		return nil, unknownKeyError(name, unknown)
	}
	c.Path = path
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &c, nil
}

// decodeError is a TOML syntax or type error, prefixed with the file; the
// message from BurntSushi/toml names the line.
type decodeError struct {
	file string
	msg  string
	err  error
}

func (e *decodeError) Error() string { return e.file + ": " + e.msg }

func (e *decodeError) Unwrap() error { return e.err }

func unknownKeyError(file string, keys []string) error {
	if len(keys) == 1 {
		return fmt.Errorf("%s: unknown key %q", file, keys[0])
	}
	return fmt.Errorf("%s: unknown keys %s", file, quoteAll(keys))
}

// unknownKeys lists the keys in the file that Config does not have, each
// section reported once rather than with every key inside it: with
// undecoded, the keys MetaData.Undecoded reports after a complete decode;
// always, the keys that match no toml tag exactly (BurntSushi/toml matches
// keys to fields case-insensitively as a fallback, so a key decoded into a
// field under another spelling counts as unknown too).
func unknownKeys(md toml.MetaData, undecoded bool) []string {
	var out []string
	var reported []toml.Key
	seen := make(map[string]bool)
	add := func(k toml.Key) {
		for _, p := range reported {
			if len(p) < len(k) && reflect.DeepEqual([]string(p), []string(k[:len(p)])) {
				return // inside a section already reported
			}
		}
		s := k.String()
		if seen[s] {
			return
		}
		seen[s] = true
		reported = append(reported, k)
		out = append(out, s)
	}
	if undecoded {
		for _, k := range md.Undecoded() {
			add(k)
		}
	}
	t := reflect.TypeFor[Config]()
	for _, k := range md.Keys() {
		if !knownKey(t, k) {
			add(k)
		}
	}
	return out
}

// knownKey reports whether k names a field of struct type t by its exact
// toml tag, section by section.
func knownKey(t reflect.Type, k toml.Key) bool {
	for i, piece := range k {
		if t.Kind() != reflect.Struct {
			return false
		}
		f, ok := fieldByTag(t, piece)
		if !ok {
			return false
		}
		t = f.Type
		if i == len(k)-1 {
			return true
		}
	}
	return false
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if tag != "" && tag != "-" && tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// applyDefaults fills the keys the file left empty.
func (c *Config) applyDefaults() {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.SocketPath == "" {
		c.SocketPath = DefaultSocketPath
	}
	if c.Log.Level == "" {
		c.Log.Level = DefaultLogLevel
	}
	if c.Log.Format == "" {
		c.Log.Format = DefaultLogFormat
	}
}

// Validate checks every key that is set. An empty key is accepted: it is
// either optional or gets its default from Load and Parse. Each error names
// the key and says what a valid value looks like.
func (c *Config) Validate() error {
	var errs []error
	if c.Gateway != "" {
		if err := checkGateway(c.Gateway); err != nil {
			errs = append(errs, err)
		}
	}
	if c.WebSocket.URL != "" {
		if err := CheckWebSocketURL(c.WebSocket.URL); err != nil {
			errs = append(errs, err)
		}
	}
	if c.WebSocket.CAFile != "" && !filepath.IsAbs(c.WebSocket.CAFile) {
		errs = append(errs, errors.New("websocket.ca_file: must be an absolute path"))
	}
	if c.GatewayServerName != "" && !isDNSName(c.GatewayServerName) {
		errs = append(errs, errors.New("gateway_server_name: must be a DNS name such as gw.example.com (no scheme, port or path)"))
	}
	for _, p := range []struct{ key, val string }{
		{"serving_ca_spki_pin", c.ServingCASPKIPin},
		{"join_signing_key_pin", c.JoinSigningKeyPin},
		{"join_encryption_key_pin", c.JoinEncryptionKeyPin},
	} {
		if p.val != "" {
			if err := checkPin(p.val); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.key, err))
			}
		}
	}
	for i, p := range c.Update.ReleasePins {
		if err := checkPin(p); err != nil {
			errs = append(errs, fmt.Errorf("update.release_pins[%d]: %w", i, err))
		}
	}
	if n := len(c.Update.ReleasePins); c.Update.ReleaseThreshold < 0 || c.Update.ReleaseThreshold > n && n > 0 {
		errs = append(errs, fmt.Errorf("update.release_threshold: %d is not between 1 and the %d release pins", c.Update.ReleaseThreshold, n))
	}
	if c.Update.SlotsDir != "" && !filepath.IsAbs(c.Update.SlotsDir) {
		errs = append(errs, errors.New("update.slots_dir: must be an absolute path, e.g. /usr/local/lib/bcd"))
	}
	if e := c.Update.Entrypoint; e != "" && (!filepath.IsAbs(e) || filepath.Clean(e) != e) {
		errs = append(errs, errors.New("update.entrypoint: must be an absolute, clean path, e.g. /usr/bin/bcd"))
	}
	if strings.ContainsFunc(c.Site.Name, isControl) {
		errs = append(errs, errors.New("site.name: must not contain control characters"))
	}
	for _, n := range c.Site.BMCNetworks {
		if _, _, err := net.ParseCIDR(n); err != nil && net.ParseIP(n) == nil {
			errs = append(errs, fmt.Errorf("site.bmc_networks: %q is neither a CIDR prefix nor an IP address", n))
		}
	}
	if c.DataDir != "" && !filepath.IsAbs(c.DataDir) {
		errs = append(errs, errors.New("data_dir: must be an absolute path, e.g. /var/lib/bcd"))
	}
	if c.SocketPath != "" && !filepath.IsAbs(c.SocketPath) {
		errs = append(errs, errors.New("socket_path: must be an absolute path, e.g. /run/bcd/bcd.sock"))
	}
	switch c.Log.Level {
	case "", "debug", "info", "warn", "error":
	default:
		errs = append(errs, errors.New("log.level: must be debug, info, warn or error"))
	}
	switch c.Log.Format {
	case "", "json", "text":
	default:
		errs = append(errs, errors.New("log.format: must be json or text"))
	}
	errs = append(errs, c.Helper.validate()...)
	errs = append(errs, c.Access.validate()...)
	errs = append(errs, c.Host.validate()...)
	errs = append(errs, c.Instances.validate()...)
	errs = append(errs, c.IMDS.validate()...)
	errs = append(errs, c.Boot.validate()...)
	errs = append(errs, c.Plugins.validate()...)
	errs = append(errs, c.Intent.validate()...)
	if len(errs) == 0 {
		return nil
	}
	return invalidError(errs)
}

// invalidError is every problem Validate found, on one line.
type invalidError []error

func (e invalidError) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e invalidError) Unwrap() []error { return e }

// Update is the [update] section (docs/update.md).
type Update struct {
	// ReleasePins are the SPKI pins (sha256/<base64>) of the release keys
	// whose signatures a release manifest needs; none turns self-update
	// off.
	ReleasePins []string `toml:"release_pins,omitempty"`
	// ReleaseThreshold is how many of them must sign (default 1).
	ReleaseThreshold int `toml:"release_threshold,omitempty"`
	// SlotsDir holds the A/B binary slots (default data_dir/bin; under
	// [helper], root's /usr/local/lib/bcd).
	SlotsDir string `toml:"slots_dir,omitempty"`
	// Entrypoint is the installed node binary adopted into slot A before
	// the first update (default [helper] entrypoint, else /usr/bin/bcd,
	// where the packages install it).
	Entrypoint string `toml:"entrypoint,omitempty"`
}

// Threshold is the release threshold with its default.
func (u Update) Threshold() int {
	if u.ReleaseThreshold == 0 && len(u.ReleasePins) > 0 {
		return 1
	}
	return u.ReleaseThreshold
}

// Site is the [site] section.
type Site struct {
	// Name names the site this machine belongs to, as doctor shows it (the
	// identity bcd join obtains is authoritative).
	Name string `toml:"name,omitempty"`
	// BMCNetworks limits which BMC addresses a site agent's bmc.* commands
	// may name: CIDR prefixes or single addresses. Empty refuses every BMC.
	BMCNetworks []string `toml:"bmc_networks,omitempty"`
}

// Boot is the [boot] section: a site agent's boot server (proxy DHCP,
// TFTP, iPXE scripts and the image cache over HTTP).
type Boot struct {
	// Listen is the HTTP address of the boot server (scripts and images);
	// without it the site agent serves no PXE machine.
	Listen string `toml:"listen,omitempty"`
	// ServerIP is the IPv4 address machines reach the boot server at.
	ServerIP string `toml:"server_ip,omitempty"`
	// URL is the base URL machines fetch scripts and images from.
	URL string `toml:"url,omitempty"`
	// ProxyDHCP answers PXE clients on UDP 67 and 4011.
	ProxyDHCP bool `toml:"proxy_dhcp,omitempty"`
	// TFTP serves the iPXE binaries from TFTPRoot on UDP 69.
	TFTP     bool   `toml:"tftp,omitempty"`
	TFTPRoot string `toml:"tftp_root,omitempty"`
	// Interface binds proxy DHCP to one interface (SO_BINDTODEVICE).
	Interface string `toml:"interface,omitempty"`
	// CacheDir holds the image cache (default data_dir/cache).
	CacheDir string `toml:"cache_dir,omitempty"`
	// CacheMaxBytes bounds the cache (0: no bound).
	CacheMaxBytes int64 `toml:"cache_max_bytes,omitempty"`
}

func (b *Boot) validate() []error {
	var errs []error
	if b.ServerIP != "" {
		if ip := net.ParseIP(b.ServerIP); ip == nil || ip.To4() == nil {
			errs = append(errs, errors.New("boot.server_ip: must be an IPv4 address"))
		}
	}
	if b.URL != "" {
		if u, err := url.Parse(b.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, errors.New("boot.url: must be an http(s) URL such as http://10.0.0.2:8080"))
		}
	}
	if b.CacheDir != "" && !filepath.IsAbs(b.CacheDir) {
		errs = append(errs, errors.New("boot.cache_dir: must be an absolute path"))
	}
	if b.TFTPRoot != "" && !filepath.IsAbs(b.TFTPRoot) {
		errs = append(errs, errors.New("boot.tftp_root: must be an absolute path"))
	}
	if b.CacheMaxBytes < 0 {
		errs = append(errs, errors.New("boot.cache_max_bytes: must not be negative"))
	}
	return errs
}

// Plugins is the [plugins] section: bcx driver plugins (components/bcx).
type Plugins struct {
	// Dir holds the plugin binaries (bcx-<driver id>) and the pins file
	// ("<sha256 hex>  <file name>" lines); empty: no plugins.
	Dir string `toml:"dir,omitempty"`
	// UIDBase is the first uid and gid of the block plugins run as when
	// bcd is root (default 0x7FFE0000); the block is 65536 ids.
	UIDBase int64 `toml:"uid_base,omitempty"`
}

// Intent is the [intent] section.
type Intent struct {
	// UnbatchedDestructivePerHour is how many destructive commands may run
	// without an approved batch in a rolling hour of the host clock, once
	// the trust bundle names approvers (default 0: none).
	UnbatchedDestructivePerHour int `toml:"unbatched_destructive_per_hour,omitempty"`
}

func (i *Intent) validate() []error {
	if i.UnbatchedDestructivePerHour < 0 || i.UnbatchedDestructivePerHour > 10000 {
		return []error{errors.New("intent.unbatched_destructive_per_hour: must be within 0..10000")}
	}
	return nil
}

func (p *Plugins) validate() []error {
	var errs []error
	if p.Dir != "" && !filepath.IsAbs(p.Dir) {
		errs = append(errs, errors.New("plugins.dir: must be an absolute path, e.g. /usr/lib/bcd/plugins"))
	}
	if p.UIDBase < 0 || p.UIDBase != 0 && (p.UIDBase < 1000 || p.UIDBase+0x10000 > 1<<32-1) {
		errs = append(errs, errors.New("plugins.uid_base: must be at least 1000 and leave room for 65536 ids below 2^32-1"))
	}
	return errs
}

// Host is the [host] section: whether bcd configures this host from the
// NodeSpec's host section, and how often the repair pass mends drift.
// bcd helper reads root's own copy, whatever the node's says.
type Host struct {
	// Units, false, turns the host section off: bcd changes nothing of
	// the host and bcd helper refuses every host.unit. Default on.
	Units *bool `toml:"units,omitempty"`
	// RepairInterval is how often every section is planned again to mend
	// drift (a hand edit of a file bcd owns); default 10m, at least 1s.
	RepairInterval string `toml:"repair_interval,omitempty"`
}

// Instances is the [instances] section.
type Instances struct {
	// Accel is the acceleration of the instances' domains: kvm (the
	// default, production), qemu (TCG, for hosts where KVM is unusable)
	// or auto (kvm when /dev/kvm opens, else qemu). bcd helper renders
	// TCG domains only when root's own configuration says so.
	Accel string `toml:"accel,omitempty"`
	// LibvirtSocket is the absolute path of libvirtd's read-write socket;
	// empty: the system libvirtd's (qemu:///system). bcd node reads
	// through the read-only socket beside it (libvirt-sock-ro).
	LibvirtSocket string `toml:"libvirt_socket,omitempty"`
}

// The values of [instances] accel.
const (
	AccelKVM  = "kvm"
	AccelTCG  = "qemu"
	AccelAuto = "auto"
)

// IMDS is the [imds] section: where bcd node serves its instances'
// metadata service.
type IMDS struct {
	// Listen is an IP address and port ("10.9.0.1:80", "[fd09::1]:80"),
	// typically the host's address on the instances' bridge; empty: no
	// metadata service.
	Listen string `toml:"listen,omitempty"`
}

func (m *IMDS) validate() []error {
	if m.Listen == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(m.Listen)
	if err == nil {
		_, err = netip.ParseAddr(host)
	}
	if n, perr := strconv.Atoi(port); err == nil && (perr != nil || n < 1 || n > 65535) {
		err = fmt.Errorf("port %q is not 1 to 65535", port)
	}
	if err != nil {
		return []error{fmt.Errorf("imds.listen: %q is not an IP address and port: %v", m.Listen, err)}
	}
	return nil
}

func (i *Instances) validate() []error {
	var errs []error
	switch i.Accel {
	case "", AccelKVM, AccelTCG, AccelAuto:
	default:
		errs = append(errs, fmt.Errorf("instances.accel: %q is not kvm, qemu or auto", i.Accel))
	}
	if i.LibvirtSocket != "" && (!filepath.IsAbs(i.LibvirtSocket) || filepath.Clean(i.LibvirtSocket) != i.LibvirtSocket || strings.ContainsAny(i.LibvirtSocket, "?&#")) {
		errs = append(errs, fmt.Errorf("instances.libvirt_socket: %q is not an absolute, clean path", i.LibvirtSocket))
	}
	return errs
}

// Accelerator is the acceleration domains get: qemu (TCG) when accel is
// qemu, or auto and /dev/kvm does not open; else kvm.
func (i Instances) Accelerator() string {
	switch i.Accel {
	case AccelTCG:
		return AccelTCG
	case AccelAuto:
		f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
		if err != nil {
			return AccelTCG
		}
		f.Close()
	}
	return AccelKVM
}

// LibvirtURI is the URI of libvirtd's read-write socket, or with
// readOnly its read-only one: qemu:///system, with ?socket= when
// LibvirtSocket is set.
func (i Instances) LibvirtURI(readOnly bool) string {
	if i.LibvirtSocket == "" {
		return "qemu:///system"
	}
	s := i.LibvirtSocket
	if readOnly {
		s = filepath.Join(filepath.Dir(s), "libvirt-sock-ro")
	}
	return "qemu:///system?socket=" + s
}

// UnitsOn reports whether the host section is on.
func (h Host) UnitsOn() bool { return h.Units == nil || *h.Units }

// Repair is the repair interval (0: the engine's default).
func (h Host) Repair() time.Duration {
	d, _ := time.ParseDuration(h.RepairInterval)
	return d
}

func (h *Host) validate() []error {
	if h.RepairInterval == "" {
		return nil
	}
	if d, err := time.ParseDuration(h.RepairInterval); err != nil || d < time.Second {
		return []error{fmt.Errorf("host.repair_interval: %q is not a Go duration of at least 1s, e.g. \"10m\"", h.RepairInterval)}
	}
	return nil
}

// Access is the [access] section, read by whoever applies the access
// section as root: bcd helper, or bcd node running as root.
type Access struct {
	// SystemAccounts lists root and system accounts (uid below 1000) the
	// access section may give SSH principals to; by default none.
	SystemAccounts []string `toml:"system_accounts,omitempty"`
	// Console lets a console ticket open a shell as root when it names
	// root; by default a console never runs as root.
	RootConsole bool `toml:"root_console,omitempty"`
	// SSHPort is the node's loopback sshd an ssh tunnel reaches (22).
	SSHPort int `toml:"ssh_port,omitempty,omitzero"`
}

func (a *Access) validate() []error {
	var errs []error
	if a.SSHPort < 0 || a.SSHPort > 65535 {
		errs = append(errs, errors.New("access.ssh_port: must be a TCP port (1 to 65535; 22 when unset)"))
	}
	for _, n := range a.SystemAccounts {
		if n == "" || strings.ContainsFunc(n, isControlOrSpace) {
			errs = append(errs, errors.New("access.system_accounts: each must be a user name without spaces or control characters"))
			break
		}
	}
	return errs
}

func (h *Helper) validate() []error {
	var errs []error
	if h.Socket != "" && !filepath.IsAbs(h.Socket) {
		errs = append(errs, errors.New("helper.socket: must be an absolute path, e.g. /run/bcd-helper/helper.sock"))
	}
	switch {
	case h.User == "root":
		errs = append(errs, errors.New("helper.user: must be an unprivileged account, not root"))
	case strings.ContainsFunc(h.User, isControlOrSpace):
		errs = append(errs, errors.New("helper.user: must be a user name without spaces or control characters"))
	}
	if h.Socket != "" && h.User == "" {
		errs = append(errs, errors.New("helper.user: must be set when helper.socket is (the account bcd node runs as)"))
	}
	if h.User != "" && h.Socket == "" {
		errs = append(errs, errors.New("helper.socket: must be set when helper.user is"))
	}
	if h.Entrypoint != "" && (!filepath.IsAbs(h.Entrypoint) || filepath.Clean(h.Entrypoint) != h.Entrypoint) {
		errs = append(errs, errors.New("helper.entrypoint: must be an absolute, clean path, e.g. /usr/local/bin/bcd-node"))
	}
	if h.StateDir != "" && (!filepath.IsAbs(h.StateDir) || filepath.Clean(h.StateDir) != h.StateDir) {
		errs = append(errs, errors.New("helper.state_dir: must be an absolute, clean path, e.g. /var/lib/bcd-helper"))
	}
	for _, r := range h.CommandRootSHA256 {
		if len(r) != 64 || strings.Trim(strings.ToLower(r), "0123456789abcdef") != "" {
			errs = append(errs, errors.New("helper.command_root_sha256: each must be 64 hex digits, the SHA-256 of a root's SPKI DER"))
			break
		}
	}
	return errs
}

// checkGateway requires an https URL with a host and nothing secret in it.
// The value is not echoed: a URL may carry credentials.
// CheckWebSocketURL checks a [websocket] url: wss://host[:port]/v1/session.
func CheckWebSocketURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return errors.New("websocket.url: is not a URL; use wss://host[:port]/v1/session")
	case u.Scheme != "wss":
		return errors.New("websocket.url: must be a wss:// URL, e.g. wss://proxy.example.com/v1/session")
	case u.Host == "" || u.Hostname() == "":
		return errors.New("websocket.url: needs a host, e.g. wss://proxy.example.com/v1/session")
	case u.User != nil:
		return errors.New("websocket.url: must not contain a user name or password")
	case u.Path != "/v1/session" || u.RawQuery != "" || u.Fragment != "":
		return errors.New("websocket.url: the path must be /v1/session, with no query")
	}
	return nil
}

func checkGateway(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("gateway: is not a URL; use https://host[:port]")
	}
	if u.Scheme != "https" {
		return errors.New("gateway: must be an https:// URL, e.g. https://gw.example.com")
	}
	if u.Host == "" || u.Hostname() == "" {
		return errors.New("gateway: needs a host, e.g. https://gw.example.com")
	}
	if u.User != nil {
		return errors.New("gateway: must not contain a user name or password")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return errors.New("gateway: must not have a query or fragment; use https://host[:port]")
	}
	return nil
}

// isDNSName reports whether s is a plausible DNS host name.
func isDNSName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(strings.TrimSuffix(s, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

func isControl(r rune) bool        { return r < 0x20 || r == 0x7f }
func isControlOrSpace(r rune) bool { return isControl(r) || r == ' ' }

// JoinEncryptionJWKPath is join-encryption.jwk in the configuration file's
// directory.
func (c *Config) JoinEncryptionJWKPath() string {
	return filepath.Join(filepath.Dir(c.Path), "join-encryption.jwk")
}
