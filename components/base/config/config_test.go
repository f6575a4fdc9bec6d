package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const (
	pinA = "sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
	pinB = "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // substring; empty means success
		check   func(t *testing.T, c *Config)
	}{
		{
			name: "minimal with defaults",
			in:   `gateway = "https://gw.example.com"`,
			check: func(t *testing.T, c *Config) {
				want := Config{
					Gateway:    "https://gw.example.com",
					DataDir:    DefaultDataDir,
					SocketPath: DefaultSocketPath,
					Log:        Log{Level: "info", Format: "json"},
					Path:       "/etc/bcd/config.toml",
				}
				if !reflect.DeepEqual(*c, want) {
					t.Errorf("got %+v, want %+v", *c, want)
				}
			},
		},
		{
			name: "empty file gets defaults",
			in:   ``,
			check: func(t *testing.T, c *Config) {
				if c.DataDir != "/var/lib/bcd" || c.SocketPath != "/run/bcd/bcd.sock" || c.Log.Level != "info" || c.Log.Format != "json" {
					t.Errorf("defaults not applied: %+v", *c)
				}
			},
		},
		{
			name: "full",
			in: `
gateway = "https://10.0.0.1:8443"
gateway_server_name = "gw.example.com"
serving_ca_spki_pin = "` + pinA + `"
join_signing_key_pin = "` + pinB + `"
join_encryption_key_pin = "` + pinA + `"
data_dir = "/srv/bcd"
socket_path = "/run/bcd/x.sock"
[log]
level = "debug"
format = "text"
[helper]
socket = "/run/bcd-helper/helper.sock"
user = "bcd"
[site]
name = "fsn1"
bmc_networks = ["10.1.0.0/16", "192.0.2.7"]
`,
			check: func(t *testing.T, c *Config) {
				if c.Log.Level != "debug" || c.Log.Format != "text" || c.Helper.User != "bcd" || c.DataDir != "/srv/bcd" || c.Site.Name != "fsn1" {
					t.Errorf("got %+v", *c)
				}
			},
		},
		{name: "unknown top-level key", in: "gateway = \"https://gw.example.com\"\ngatewayy = \"x\"", wantErr: `config.toml: unknown key "gatewayy"`},
		{name: "unknown dotted key", in: `gateway.urll = "https://x"`, wantErr: `unknown key "gateway.urll"`},
		{name: "unknown key in log", in: "[log]\nlevel = \"info\"\ncolour = true", wantErr: `config.toml: unknown key "log.colour"`},
		{name: "unknown section reported once", in: "[bmc]\nlisten = \"x\"\nurl = \"y\"", wantErr: `config.toml: unknown key "bmc"`},
		{name: "boot url checked", in: "[boot]\nlisten = \"x\"\nurl = \"y\"", wantErr: `boot.url: must be an http(s) URL`},
		{name: "boot unknown key", in: "[boot]\nlisten = \":80\"\nurls = \"y\"", wantErr: `unknown key "boot.urls"`},
		{name: "two unknown keys", in: "a = 1\nb = 2", wantErr: `unknown keys "a", "b"`},
		{name: "key in another case", in: `Gateway = "https://gw.example.com"`, wantErr: `unknown key "Gateway"`},
		{name: "section in another case", in: "[LOG]\nlevel = \"info\"", wantErr: `unknown key "LOG"`},
		{name: "syntax error names file and line", in: "data_dir = \"/a\"\n\ngateway = ", wantErr: "/etc/bcd/config.toml: line 3"},
		{name: "wrong type", in: `data_dir = 5`, wantErr: "/etc/bcd/config.toml: line 1 (last key \"data_dir\")"},
		{name: "wrong type before a valid section", in: "data_dir = 5\n[log]\nlevel = \"info\"\n[helper]\nuser = \"bcd\"", wantErr: `/etc/bcd/config.toml: line 1 (last key "data_dir")`},
		{name: "wrong type and an unknown key", in: "data_dir = 5\nsitee = \"x\"", wantErr: `unknown key "sitee"`},
		{name: "section given as string", in: `log = "debug"`, wantErr: "/etc/bcd/config.toml"},
		{name: "http gateway refused", in: `gateway = "http://gw.example.com"`, wantErr: "gateway: must be an https:// URL"},
		{name: "gateway without host", in: `gateway = "https:///x"`, wantErr: "gateway: needs a host"},
		{name: "gateway with credentials", in: `gateway = "https://u:secretpw@gw.example.com"`, wantErr: "gateway: must not contain"},
		{name: "gateway not a URL", in: `gateway = "gw.example.com"`, wantErr: "gateway:"},
		{name: "bad server name", in: `gateway_server_name = "https://gw"`, wantErr: "gateway_server_name:"},
		{name: "pin without prefix", in: `serving_ca_spki_pin = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="`, wantErr: "serving_ca_spki_pin: must start with sha256/"},
		{name: "pin not base64", in: `join_signing_key_pin = "sha256/not base64!"`, wantErr: "join_signing_key_pin: the part after sha256/ is not standard padded base64"},
		{name: "pin url-safe base64", in: `join_signing_key_pin = "sha256/47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU="`, wantErr: "join_signing_key_pin:"},
		{name: "pin unpadded", in: `join_signing_key_pin = "sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"`, wantErr: "join_signing_key_pin:"},
		{name: "pin wrong length", in: `join_encryption_key_pin = "sha256/AAAA"`, wantErr: "join_encryption_key_pin: the part after sha256/ must encode 32 bytes"},
		{name: "bad log level", in: "[log]\nlevel = \"loud\"", wantErr: "log.level: must be debug, info, warn or error"},
		{name: "bad release pin", in: "[update]\nrelease_pins = [\"md5/x\"]", wantErr: "update.release_pins[0]:"},
		{name: "release threshold above the pins", in: "[update]\nrelease_pins = [\"sha256/" + strings.Repeat("A", 43) + "=\"]\nrelease_threshold = 2", wantErr: "update.release_threshold: 2 is not between 1 and the 1 release pins"},
		{name: "relative update entrypoint", in: "[update]\nentrypoint = \"bcd\"", wantErr: "update.entrypoint: must be an absolute, clean path"},
		{name: "relative slots dir", in: "[update]\nslots_dir = \"bin\"", wantErr: "update.slots_dir: must be an absolute path"},
		{name: "bad log format", in: "[log]\nformat = \"xml\"", wantErr: "log.format: must be json or text"},
		{name: "relative data_dir", in: `data_dir = "var/lib/bcd"`, wantErr: "data_dir: must be an absolute path"},
		{name: "relative socket_path", in: `socket_path = "bcd.sock"`, wantErr: "socket_path: must be an absolute path"},
		{name: "relative helper socket", in: "[helper]\nsocket = \"h.sock\"\nuser = \"bcd\"", wantErr: "helper.socket: must be an absolute path"},
		{name: "helper user root", in: "[helper]\nsocket = \"/run/h.sock\"\nuser = \"root\"", wantErr: "helper.user: must be an unprivileged account"},
		{name: "helper socket without user", in: "[helper]\nsocket = \"/run/h.sock\"", wantErr: "helper.user: must be set"},
		{name: "helper user without socket", in: "[helper]\nuser = \"bcd\"", wantErr: "helper.socket: must be set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := "/etc/bcd/config.toml"
			if strings.HasPrefix(tt.wantErr, "config.toml:") {
				path = ""
			}
			c, err := Parse([]byte(tt.in), path)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Parse succeeded with %+v, want error containing %q", *c, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %q does not contain %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "secretpw") {
					t.Errorf("error echoes a credential: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

func TestCheckPin(t *testing.T) {
	tests := []struct {
		pin string
		ok  bool
	}{
		{pinA, true},
		{pinB, true},
		{"", false},
		{"sha256/", false},
		{"sha1/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=", false},
		{"SHA256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=", false},
		{"sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU= ", false},
		{"sha256/" + strings.Repeat("A", 64), false},
	}
	for _, tt := range tests {
		if err := checkPin(tt.pin); (err == nil) != tt.ok {
			t.Errorf("checkPin(%q) = %v, want ok=%v", tt.pin, err, tt.ok)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name     string
		setup    func(t *testing.T) string
		wantErr  bool
		notExist bool
	}{
		{
			name: "ok",
			setup: func(t *testing.T) string {
				p := filepath.Join(dir, "ok.toml")
				writeTestFile(t, p, `gateway = "https://gw.example.com"`)
				return p
			},
		},
		{
			name:     "missing file",
			setup:    func(t *testing.T) string { return filepath.Join(dir, "missing.toml") },
			wantErr:  true,
			notExist: true,
		},
		{
			name: "too large",
			setup: func(t *testing.T) string {
				p := filepath.Join(dir, "big.toml")
				writeTestFile(t, p, "# "+strings.Repeat("x", maxFileSize)+"\n")
				return p
			},
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.setup(t)
			c, err := Load(p)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Load: err = %v, wantErr %v", err, tt.wantErr)
			}
			if got := errors.Is(err, fs.ErrNotExist); got != tt.notExist {
				t.Errorf("errors.Is(err, fs.ErrNotExist) = %v, want %v (err %v)", got, tt.notExist, err)
			}
			if err == nil && c.Path != p {
				t.Errorf("Path = %q, want %q", c.Path, p)
			}
		})
	}
}

func TestJoinEncryptionJWKPath(t *testing.T) {
	tests := []struct{ path, want string }{
		{"/etc/bcd/config.toml", "/etc/bcd/join-encryption.jwk"},
		{"sim.toml", "join-encryption.jwk"},
		{"./lab/sim.toml", "lab/join-encryption.jwk"},
	}
	for _, tt := range tests {
		c := &Config{Path: tt.path}
		if got := c.JoinEncryptionJWKPath(); got != tt.want {
			t.Errorf("JoinEncryptionJWKPath() for %q = %q, want %q", tt.path, got, tt.want)
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	tests := []struct {
		name      string
		in        Config
		wantLines []string
		notLines  []string
	}{
		{
			name: "full",
			in: Config{
				Gateway:              "https://gw.example.com:8443",
				GatewayServerName:    "gw.example.com",
				ServingCASPKIPin:     pinA,
				JoinSigningKeyPin:    pinB,
				JoinEncryptionKeyPin: pinA,
				Site:                 Site{Name: `fsn "1"`},
				DataDir:              "/var/lib/bcd",
				SocketPath:           "/run/bcd/bcd.sock",
				Log:                  Log{Level: "warn", Format: "text"},
				Helper:               Helper{Socket: "/run/bcd-helper/helper.sock", User: "bcd"},
			},
			wantLines: []string{"# bcd configuration", `gateway = "https://gw.example.com:8443"`, "[log]", "[helper]", `user = "bcd"`},
		},
		{
			name:      "empty sections omitted",
			in:        Config{Gateway: "https://gw.example.com", DataDir: "/var/lib/bcd", SocketPath: "/run/bcd/bcd.sock", Log: Log{Level: "info", Format: "json"}},
			wantLines: []string{`data_dir = "/var/lib/bcd"`, "[log]"},
			notLines:  []string{"[helper]", "site", "gateway_server_name"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := tt.in.Marshal()
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			text := string(data)
			for _, l := range tt.wantLines {
				if !strings.Contains(text, l) {
					t.Errorf("output lacks %q:\n%s", l, text)
				}
			}
			for _, l := range tt.notLines {
				if strings.Contains(text, l) {
					t.Errorf("output has %q:\n%s", l, text)
				}
			}
			got, err := Parse(data, "x.toml")
			if err != nil {
				t.Fatalf("Parse(Marshal()): %v\n%s", err, text)
			}
			want := tt.in
			want.Path = "x.toml"
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("round trip:\n got %+v\nwant %+v", *got, want)
			}
		})
	}
}

func TestMarshalRefusesInvalid(t *testing.T) {
	c := &Config{Gateway: "http://gw.example.com"}
	if _, err := c.Marshal(); err == nil {
		t.Fatal("Marshal of an http gateway succeeded")
	}
}

func TestWriteFile(t *testing.T) {
	tests := []struct {
		name    string
		rel     string
		c       Config
		wantErr bool
	}{
		{name: "new parent directory", rel: "etc/bcd/config.toml", c: Config{Gateway: "https://gw.example.com", Site: Site{Name: "a"}}},
		{name: "replace existing", rel: "config.toml", c: Config{Gateway: "https://gw2.example.com"}},
		{name: "invalid config refused", rel: "bad.toml", c: Config{DataDir: "relative"}, wantErr: true},
	}
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "config.toml"), "old = 1")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, tt.rel)
			err := WriteFile(p, &tt.c)
			if tt.wantErr {
				if err == nil {
					t.Fatal("WriteFile succeeded")
				}
				if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("file exists after a failed write: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("WriteFile: %v", err)
			}
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if mode := st.Mode().Perm(); mode != 0o600 {
				t.Errorf("mode = %o, want 600", mode)
			}
			got, err := Load(p)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got.Gateway != tt.c.Gateway || got.Site.Name != tt.c.Site.Name {
				t.Errorf("loaded %+v, wrote %+v", *got, tt.c)
			}
			entries, err := os.ReadDir(filepath.Dir(p))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if strings.Contains(e.Name(), ".tmp-") {
					t.Errorf("temporary file left behind: %s", e.Name())
				}
			}
		})
	}
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestPluginsSection(t *testing.T) {
	c, err := Parse([]byte("[plugins]\ndir = \"/usr/lib/bcd/plugins\"\nuid_base = 2147352576\n"), "")
	if err != nil || c.Plugins.Dir != "/usr/lib/bcd/plugins" || c.Plugins.UIDBase != 0x7FFE0000 {
		t.Fatalf("%+v %v", c, err)
	}
	for in, want := range map[string]string{
		"[plugins]\ndir = \"plugins\"\n":     "plugins.dir",
		"[plugins]\nuid_base = 10\n":         "plugins.uid_base",
		"[plugins]\nuid_base = 4294967000\n": "plugins.uid_base",
		"[plugins]\npins = \"x\"\n":          "unknown key",
	} {
		if _, err := Parse([]byte(in), ""); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func TestInstances(t *testing.T) {
	for _, tt := range []struct {
		toml, want, uri, ro string
	}{
		{toml: "", uri: "qemu:///system", ro: "qemu:///system"},
		{toml: "[instances]\naccel = \"qemu\"\nlibvirt_socket = \"/run/lv/libvirt-sock\"\n", uri: "qemu:///system?socket=/run/lv/libvirt-sock", ro: "qemu:///system?socket=/run/lv/libvirt-sock-ro"},
		{toml: "[instances]\naccel = \"tcg\"\n", want: "instances.accel"},
		{toml: "[instances]\nlibvirt_socket = \"/run/lv/sock?x=1\"\n", want: "instances.libvirt_socket"},
		{toml: "[instances]\nlibvirt_socket = \"run/sock\"\n", want: "instances.libvirt_socket"},
	} {
		c, err := Parse([]byte(tt.toml), "")
		if tt.want != "" {
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%q: %v, want an error naming %s", tt.toml, err, tt.want)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tt.toml, err)
		}
		if got, ro := c.Instances.LibvirtURI(false), c.Instances.LibvirtURI(true); got != tt.uri || ro != tt.ro {
			t.Errorf("%q: URIs %q, %q", tt.toml, got, ro)
		}
	}
}

func TestIMDS(t *testing.T) {
	for _, tt := range []struct{ toml, want string }{
		{toml: ""},
		{toml: "[imds]\nlisten = \"10.9.0.1:80\"\n"},
		{toml: "[imds]\nlisten = \"[fd09::1]:80\"\n"},
		{toml: "[imds]\nlisten = \"imds.example:80\"\n", want: "imds.listen"},
		{toml: "[imds]\nlisten = \"10.9.0.1\"\n", want: "imds.listen"},
		{toml: "[imds]\nlisten = \"10.9.0.1:0\"\n", want: "imds.listen"},
		{toml: "[imds]\nlisten = \"10.9.0.1:80\"\nport = 1\n", want: "port"},
	} {
		_, err := Parse([]byte(tt.toml), "")
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%q: %v, want %q", tt.toml, err, tt.want)
		}
	}
}

func TestAccelerator(t *testing.T) {
	_, kvmErr := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	auto := AccelKVM
	if kvmErr != nil {
		auto = AccelTCG
	}
	for accel, want := range map[string]string{"": AccelKVM, AccelKVM: AccelKVM, AccelTCG: AccelTCG, AccelAuto: auto} {
		if got := (Instances{Accel: accel}).Accelerator(); got != want {
			t.Errorf("accel %q: %s, want %s", accel, got, want)
		}
	}
}
