package doctor

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/helperclient"
)

// helperAt serves answer on top/run/helper.sock, reading each request
// first, until the test ends.
func helperAt(t *testing.T, top, answer string) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(top, "run/helper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.ReadAll(c)
			c.Write([]byte(answer))
			c.Close()
		}
	}()
}

func TestHelperCheck(t *testing.T) {
	owner := uint32(os.Geteuid())
	cfg := config.Helper{Socket: "/run/helper.sock", User: "bcd"}
	tests := []struct {
		name   string
		setup  func(t *testing.T, top string, h *config.Helper)
		status Status
		detail string
	}{
		{"answers", func(t *testing.T, top string, _ *config.Helper) { helperAt(t, top, `{"v":1,"ok":true}`) },
			OK, "/run/helper.sock answers in "},
		{"no socket", func(*testing.T, string, *config.Helper) {},
			Fail, "no socket at /run/helper.sock: bcd helper is not running (systemctl restart bcd-helper.service"},
		{"a socket nobody listens on", func(t *testing.T, top string, _ *config.Helper) {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(top, "run/helper.sock"), Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
		}, Fail, "nothing listens on /run/helper.sock: bcd helper is not running"},
		{"a file, not a socket", func(t *testing.T, top string, _ *config.Helper) {
			helperMust(t, os.WriteFile(filepath.Join(top, "run/helper.sock"), nil, 0o644))
		}, Fail, "/run/helper.sock is not a socket"},
		{"this process not allowed", func(t *testing.T, top string, _ *config.Helper) {
			helperAt(t, top, `{"v":1,"ok":false,"error":"not allowed","retryable":false}`)
		}, Fail, "refused this process (not allowed): run bcd doctor as root or as bcd"},
		{"a helper without ping", func(t *testing.T, top string, _ *config.Helper) {
			helperAt(t, top, `{"v":1,"ok":false,"error":"request: unknown operation \"ping\"","retryable":false}`)
		}, Fail, `answered: request: unknown operation "ping" (a helper of another version`},
		{"busy", func(t *testing.T, top string, _ *config.Helper) {
			helperAt(t, top, `{"v":1,"ok":false,"error":"busy: bcd helper serves at most 32 requests at once; try again","retryable":true}`)
		}, Warn, "is busy"},
		{"socket directory others can write", func(t *testing.T, top string, _ *config.Helper) {
			helperAt(t, top, `{"v":1,"ok":true}`)
			helperMust(t, os.Chmod(filepath.Join(top, "run"), 0o777))
		}, Fail, "/run must be a directory root owns that no one else can write (the helper socket lives there), so bcd helper refuses to start"},
		{"entrypoint's directory a symlink", func(t *testing.T, top string, h *config.Helper) {
			helperAt(t, top, `{"v":1,"ok":true}`)
			helperMust(t, os.Mkdir(filepath.Join(top, "real"), 0o755))
			helperMust(t, os.Symlink(filepath.Join(top, "real"), filepath.Join(top, "bin")))
			h.Entrypoint = "/bin/bcd"
		}, Fail, "/bin must be a directory root owns that no one else can write ([helper] entrypoint is there)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			top := t.TempDir()
			helperMust(t, os.Chmod(top, 0o755))
			helperMust(t, os.Mkdir(filepath.Join(top, "run"), 0o755))
			h := cfg
			tt.setup(t, top, &h)
			c := &helperclient.Client{Socket: filepath.Join(top, "run/helper.sock")}
			r := runOne(context.Background(), helperCheck(h, top, owner, c.Ping))[0]
			if r.Status != tt.status || !strings.Contains(r.Detail, tt.detail) || r.Name != "helper" {
				t.Errorf("got %s %q, want %s containing %q", r.Status, r.Detail, tt.status, tt.detail)
			}
		})
	}
}

func TestHelperCheckOnlyUnderHelper(t *testing.T) {
	if c := Helper(config.Helper{}); c != nil {
		t.Errorf("no [helper]: %d checks", len(c))
	}
	if c := Helper(config.Helper{Socket: "/run/bcd-helper/helper.sock", User: "bcd"}); len(c) != 1 || c[0].Name != "helper" {
		t.Errorf("[helper]: %+v", c)
	}
}

func helperMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
