package sdnotify

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNotify sends each state to a real datagram socket, as systemd's
// manager would receive it: by path and by abstract name; without
// $NOTIFY_SOCKET nothing is sent and nothing fails; a socket nobody
// listens on is an error.
func TestNotify(t *testing.T) {
	dir := t.TempDir()
	abstract := "@bcd-sdnotify-test-" + filepath.Base(dir)
	for _, name := range []string{filepath.Join(dir, "notify"), abstract} {
		ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("NOTIFY_SOCKET", name)
		for _, c := range []struct {
			send func() error
			want string
		}{{Ready, "READY=1"}, {Stopping, "STOPPING=1"}} {
			if err := c.send(); err != nil {
				t.Fatalf("%s to %s: %v", c.want, name, err)
			}
			buf := make([]byte, 256)
			ln.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := ln.Read(buf)
			if err != nil || string(buf[:n]) != c.want {
				t.Errorf("%s received %q (%v), want %q", name, buf[:n], err, c.want)
			}
		}
		ln.Close()
	}

	t.Setenv("NOTIFY_SOCKET", "")
	if err := Ready(); err != nil {
		t.Errorf("without NOTIFY_SOCKET: %v, want nothing sent and no error", err)
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(dir, "nobody"))
	if err := Ready(); err == nil || !strings.Contains(err.Error(), "notify socket") {
		t.Errorf("a socket nobody listens on: %v, want an error naming it", err)
	}
}
