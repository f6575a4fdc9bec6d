package doctor

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
)

// want is what a test expects of a Result: its status, and either the whole
// detail or substrings of it.
type want struct {
	status   Status
	detail   string   // exact, when set
	contains []string // substrings
}

func (w want) check(t *testing.T, r Result, name string) {
	t.Helper()
	if r.Name != name {
		t.Errorf("name %q, want %q", r.Name, name)
	}
	if r.Status != w.status {
		t.Errorf("status %s, want %s (detail: %s)", r.Status, w.status, r.Detail)
	}
	if w.detail != "" && r.Detail != w.detail {
		t.Errorf("detail\n %q\nwant\n %q", r.Detail, w.detail)
	}
	for _, s := range w.contains {
		if !strings.Contains(r.Detail, s) {
			t.Errorf("detail %q lacks %q", r.Detail, s)
		}
	}
}

func TestConfigCheck(t *testing.T) {
	const body = "gateway = \"https://gw.eu-1.example.com\"\n[site]\nname = \"fsn1\"\n"
	tests := []struct {
		name string
		body string // "" leaves the file out
		mode os.FileMode
		want want
	}{
		{"0600", body, 0o600, want{status: OK, detail: "PATH: gateway https://gw.eu-1.example.com, site fsn1"}},
		{"0640 group read is fine", body, 0o640, want{status: OK, detail: "PATH: gateway https://gw.eu-1.example.com, site fsn1"}},
		{"0400", body, 0o400, want{status: OK}},
		{"others read", body, 0o644, want{status: Warn, contains: []string{"PATH: gateway https://gw.eu-1.example.com, site fsn1; others can read it (mode 0644): chmod o-rwx PATH"}}},
		{"others write", body, 0o602, want{status: Warn, contains: []string{"others can read it (mode 0602)"}}},
		{"group write", body, 0o660, want{status: Warn, contains: []string{"its group can write it (mode 0660): chmod g-w PATH"}}},
		{"both", body, 0o666, want{status: Warn, contains: []string{"others can read it and its group can write it (mode 0666): chmod 0640 PATH"}}},
		{"no gateway", "[site]\nname = \"fsn1\"\n", 0o600, want{status: Warn, contains: []string{"gateway (none), site fsn1", "no gateway is set"}}},
		{"unknown key", "gatewya = \"https://gw\"\n", 0o600, want{status: Fail, contains: []string{"unknown key \"gatewya\""}}},
		{"invalid value", "gateway = \"http://gw\"\n", 0o600, want{status: Fail, contains: []string{"gateway: must be an https:// URL"}}},
		{"missing", "", 0, want{status: Fail, contains: []string{"no such file", "bcd join --server writes one"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if tt.body != "" {
				if err := os.WriteFile(path, []byte(tt.body), tt.mode); err != nil {
					t.Fatal(err)
				}
				os.Chmod(path, tt.mode) // past the umask
			}
			w := tt.want
			w.detail = strings.ReplaceAll(w.detail, "PATH", path)
			for i := range w.contains {
				w.contains[i] = strings.ReplaceAll(w.contains[i], "PATH", path)
			}
			w.check(t, Config(path).Run(context.Background()), "config")
		})
	}
}

// joined writes an identity valid until notAfter into dir.
func joined(t *testing.T, dir string, notAfter time.Time) {
	t.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "node_01k5w"},
		NotBefore:    notAfter.Add(-24 * time.Hour),
		NotAfter:     notAfter,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := identity.Save(dir, key, cert, identity.Identity{NodeID: "node_01k5w", Site: "fsn1", Role: "node"}); err != nil {
		t.Fatal(err)
	}
}

func TestIdentityCheck(t *testing.T) {
	notAfter := time.Date(2026, 9, 27, 8, 0, 0, 0, time.UTC)
	now := notAfter.Add(-(14*time.Hour + 12*time.Minute + 7*time.Second))
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		now   time.Time
		want  want
	}{
		{
			name:  "valid",
			setup: func(t *testing.T, dir string) { joined(t, dir, notAfter) },
			now:   now,
			want:  want{status: OK, detail: "node node_01k5w (site fsn1, role node), certificate valid for 14h12m0s"},
		},
		{
			name:  "under a minute left",
			setup: func(t *testing.T, dir string) { joined(t, dir, notAfter) },
			now:   notAfter.Add(-30 * time.Second),
			want:  want{status: OK, contains: []string{"certificate valid for 30s"}},
		},
		{
			name:  "expired",
			setup: func(t *testing.T, dir string) { joined(t, dir, notAfter) },
			now:   notAfter.Add(time.Minute),
			want:  want{status: Fail, contains: []string{"node node_01k5w (site fsn1, role node), certificate expired at 2026-09-27T08:00:00Z", "bcd join --reset --yes, then bcd join"}},
		},
		{
			name:  "not joined",
			setup: func(t *testing.T, dir string) {},
			now:   now,
			want:  want{status: Warn, contains: []string{"this node has not joined (run bcd join)"}},
		},
		{
			name: "unreadable identity.json",
			setup: func(t *testing.T, dir string) {
				os.WriteFile(filepath.Join(dir, identity.IdentityFile), []byte("{not json"), 0o600)
			},
			now:  now,
			want: want{status: Fail, contains: []string{"the identity does not load", "bcd join --reset --yes, then bcd join"}},
		},
		{
			name: "a key that does not match the certificate",
			setup: func(t *testing.T, dir string) {
				joined(t, dir, notAfter)
				other := t.TempDir()
				joined(t, other, notAfter)
				b, _ := os.ReadFile(filepath.Join(other, identity.KeyFile))
				os.WriteFile(filepath.Join(dir, identity.KeyFile), b, 0o600)
			},
			now:  now,
			want: want{status: Fail, contains: []string{"is not for", "bcd join --reset --yes"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(t, dir)
			c := Identity(dir, func() time.Time { return tt.now })
			tt.want.check(t, c.Run(context.Background()), "identity")
		})
	}
}

func TestGatewayCheck(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	open := l.Addr().String()

	closedL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := closedL.Addr().String()
	closedL.Close()

	var d net.Dialer
	hang := func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	tests := []struct {
		name string
		url  string
		dial dialFunc
		want want
	}{
		{"reachable", "https://" + open, d.DialContext, want{status: OK, contains: []string{open + " reachable in "}}},
		{"refused", "https://" + closed, d.DialContext, want{status: Fail, contains: []string{closed + ": TCP connect failed", "refused"}}},
		{"no answer", "https://gw.example.com", hang, want{status: Fail, detail: "gw.example.com:443: no TCP connection within 50ms: check the network, firewall and gateway in config.toml"}},
		{"no gateway", "", d.DialContext, want{status: Fail, contains: []string{"no gateway in config.toml"}}},
		{"not a URL", "gw.example.com", d.DialContext, want{status: Fail, contains: []string{"not an https://host[:port] URL"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			begin := time.Now()
			r := gateway(tt.url, 50*time.Millisecond, tt.dial).Run(context.Background())
			tt.want.check(t, r, "gateway")
			if d := time.Since(begin); d > 2*time.Second {
				t.Errorf("took %s", d)
			}
		})
	}
}

func TestGatewayAddr(t *testing.T) {
	tests := []struct {
		url, want string
		err       bool
	}{
		{"https://gw.eu-1.example.com", "gw.eu-1.example.com:443", false},
		{"https://gw.example.com:8443", "gw.example.com:8443", false},
		{"https://gw.example.com/", "gw.example.com:443", false},
		{"https://[2001:db8::1]:8443", "[2001:db8::1]:8443", false},
		{"https://10.0.0.1", "10.0.0.1:443", false},
		{"", "", true},
		{"://", "", true},
	}
	for _, tt := range tests {
		got, err := gatewayAddr(tt.url)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("gatewayAddr(%q) = %q, %v", tt.url, got, err)
		}
	}
}

func TestNVML(t *testing.T) {
	notFound := errors.New("nvidia-smi --query-gpu=driver_version: nvidia-smi not found (no NVIDIA driver on this host)")
	tests := []struct {
		name  string
		probe func(context.Context) (string, int, error)
		want  want
	}{
		{"eight GPUs", func(context.Context) (string, int, error) { return "570.86.15", 8, nil }, want{status: OK, detail: "driver 570.86.15, 8 GPUs"}},
		{"one GPU", func(context.Context) (string, int, error) { return "570.86.15", 1, nil }, want{status: OK, detail: "driver 570.86.15, 1 GPU"}},
		{"no GPUs", func(context.Context) (string, int, error) { return "570.86.15", 0, nil }, want{status: Warn, detail: "driver 570.86.15, no GPUs"}},
		{"no nvidia-smi", func(context.Context) (string, int, error) { return "", 0, notFound }, want{status: Warn, detail: "nvidia-smi not found (no NVIDIA driver on this host)"}},
		{"driver broken", func(context.Context) (string, int, error) {
			return "", 0, errors.New("nvidia-smi = exit status 9: NVIDIA-SMI has failed")
		}, want{status: Fail, detail: "nvidia-smi = exit status 9: NVIDIA-SMI has failed"}},
		{"not in this build", nil, want{status: Warn, detail: "NVML is not available in this build"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.want.check(t, NVML(tt.probe).Run(context.Background()), "nvml")
		})
	}
}

func TestHardware(t *testing.T) {
	tests := []struct {
		name    string
		collect func(context.Context) (int, int, error)
		want    want
	}{
		{"host", func(context.Context) (int, int, error) { return 8, 12, nil }, want{status: OK, detail: "host: 8 GPUs, 12 inventory sections hashed"}},
		{"no GPUs", func(context.Context) (int, int, error) { return 0, 9, nil }, want{status: OK, detail: "host: 0 GPUs, 9 inventory sections hashed"}},
		{"fails", func(context.Context) (int, int, error) {
			return 0, 0, errors.New("read /sys/class/dmi: permission denied")
		}, want{status: Fail, detail: "host: collecting the inventory failed: read /sys/class/dmi: permission denied"}},
		{"none", nil, want{status: Warn, detail: "no hardware backend in this build"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.want.check(t, Hardware("host", tt.collect).Run(context.Background()), "hardware")
		})
	}
}

func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 GPUs", 1: "1 GPU", 16: "16 GPUs"} {
		if got := plural(n, "GPU"); got != want {
			t.Errorf("plural(%d) = %q", n, got)
		}
	}
}
