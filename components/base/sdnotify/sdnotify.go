// Package sdnotify tells systemd how a Type=notify service is doing
// (sd_notify(3)): READY=1 once it serves, STOPPING=1 when it begins to
// stop. The manager names its datagram socket in $NOTIFY_SOCKET; a
// process started any other way has none, and then nothing is sent.
package sdnotify

import (
	"fmt"
	"net"
	"os"
)

// Ready tells the manager the service is up: a unit's start finishes
// (and units ordered after it start) only then.
func Ready() error { return Notify("READY=1") }

// Stopping tells the manager the service is shutting down.
func Stopping() error { return Notify("STOPPING=1") }

// Notify sends state, newline-separated VAR=VALUE lines, to the socket
// $NOTIFY_SOCKET names (a path, or an abstract name starting with @,
// which Go's unix addresses take as they are). Without it, it does
// nothing.
func Notify(state string) error {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return nil
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("dialling the service manager's notify socket: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("telling the service manager %q: %w", state, err)
	}
	return nil
}
