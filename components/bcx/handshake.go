package bcx

import (
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// maxHandshake bounds the handshake line a plugin prints.
const maxHandshake = 8 << 10

// Handshake is what a plugin prints on its first line of stdout:
// "CORE|PROTOCOL|unix|SOCKET|grpc|CERT", CERT its certificate as base64
// (standard alphabet, no padding) DER, in go-plugin's style.
type Handshake struct {
	Core, Protocol int
	Socket         string
	Cert           *x509.Certificate
}

// Line formats h as the plugin prints it (without the newline).
func (h Handshake) Line() string {
	return fmt.Sprintf("%d|%d|unix|%s|grpc|%s", h.Core, h.Protocol, h.Socket, base64.RawStdEncoding.EncodeToString(h.Cert.Raw))
}

// ParseHandshake parses a plugin's handshake line (with or without its
// newline). It checks the versions, the network and protocol, that the
// socket is an absolute path inside dir (when dir is set), and that the
// certificate parses. Errors do not quote the line.
func ParseHandshake(line, dir string) (Handshake, error) {
	var h Handshake
	if len(line) > maxHandshake {
		return h, errors.New("handshake: longer than 8 KiB")
	}
	line = strings.TrimRight(line, "\r\n")
	f := strings.Split(line, "|")
	if len(f) != 6 {
		return h, fmt.Errorf("handshake: %d fields, want 6 (CORE|PROTOCOL|unix|SOCKET|grpc|CERT)", len(f))
	}
	var err error
	if h.Core, err = strconv.Atoi(f[0]); err != nil || h.Core != CoreVersion {
		return h, fmt.Errorf("handshake: core version is not %d", CoreVersion)
	}
	if h.Protocol, err = strconv.Atoi(f[1]); err != nil || h.Protocol != ProtocolVersion {
		return h, fmt.Errorf("handshake: protocol version is not %d", ProtocolVersion)
	}
	if f[2] != "unix" {
		return h, errors.New("handshake: the network must be unix")
	}
	if f[4] != "grpc" {
		return h, errors.New("handshake: the protocol must be grpc")
	}
	h.Socket = f[3]
	if !filepath.IsAbs(h.Socket) || filepath.Clean(h.Socket) != h.Socket || len(h.Socket) > 107 {
		return h, errors.New("handshake: the socket must be a clean absolute path of at most 107 bytes")
	}
	if dir != "" && filepath.Dir(h.Socket) != filepath.Clean(dir) {
		return h, errors.New("handshake: the socket is not in the directory the host gave the plugin")
	}
	der, err := base64.RawStdEncoding.DecodeString(f[5])
	if err != nil {
		return h, errors.New("handshake: the certificate is not base64 (standard, unpadded)")
	}
	if h.Cert, err = x509.ParseCertificate(der); err != nil {
		return h, fmt.Errorf("handshake: the certificate: %w", err)
	}
	return h, nil
}
