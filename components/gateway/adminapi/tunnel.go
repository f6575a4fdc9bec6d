package adminapi

import "time"

// TunnelUpgrade is the Upgrade token of a tunnel request.
const TunnelUpgrade = "bcd-tunnel"

// TunnelRequest is what a tunnel client asks for.
type TunnelRequest struct {
	Kind    string        // console, ssh, tcp:<port>
	Account string        // the console's account (ssh, tcp: who asked)
	TTL     time.Duration // the ticket's lifetime (and the tunnel's)
}

// Frames from a tunnel client: a type byte, a 4-byte big-endian length
// and the payload (data; rows and cols as two big-endian uint16s; none).
const (
	TunnelFrameData   = 'd'
	TunnelFrameResize = 'r'
	TunnelFrameClose  = 'c'
	// MaxTunnelFrame bounds a frame's payload.
	MaxTunnelFrame = 32 << 10
)
