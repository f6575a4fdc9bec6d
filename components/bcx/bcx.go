package bcx

import (
	"errors"
	"fmt"
	"regexp"
)

// Environment the host sets for a plugin.
const (
	// CookieKey and CookieValue tell a plugin binary that bcd started it;
	// without them it refuses to run (it is not a command for people).
	CookieKey   = "BCX_PLUGIN_MAGIC_COOKIE"
	CookieValue = "6b2e0d4c0f6f4ba0a7c1f6d3bcd-driver-plugin"
	// HostCertEnv holds the host's client certificate (base64 DER), the
	// only one the plugin accepts.
	HostCertEnv = "BCX_HOST_CERT"
	// SocketDirEnv is the private directory the plugin makes its socket in.
	SocketDirEnv = "BCX_SOCKET_DIR"
)

// Handshake versions: the line's first field (this handshake's format) and
// second (the Driver service's version).
const (
	CoreVersion     = 1
	ProtocolVersion = 1
)

// PluginPrefix starts every plugin's file name: bcx-<driver id>.
const PluginPrefix = "bcx-"

var driverIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// ValidDriverID reports whether id is a driver id: lower-case letters,
// digits and '-', 1 to 32 bytes, not starting with '-'.
func ValidDriverID(id string) bool { return driverIDRe.MatchString(id) }

// Error is an operation's failure: reported by the driver, or by the host
// when the plugin is down ("unavailable", retryable).
type Error struct {
	Code      string
	Message   string
	Retryable bool
}

func (e *Error) Error() string {
	if e.Retryable {
		return fmt.Sprintf("%s (retryable): %s", e.Code, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Codes the host itself answers with.
const (
	CodeUnavailable          = "unavailable"
	CodeUnsupportedDriver    = "unsupported-driver"
	CodeUnsupportedOperation = "unsupported-operation"
)

// ErrPinMismatch is a plugin whose binary does not hash to its pin; it is
// never started.
var ErrPinMismatch = errors.New("the plugin's SHA-256 does not match its pin")

// IsRetryable reports whether err is a bcx Error marked retryable.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable
}

// CodeOf returns the code of a bcx Error in err's chain, or "".
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
