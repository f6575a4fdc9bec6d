package adminapi

import "time"

// TunnelUpgrade is the Upgrade token of a tunnel request.
const TunnelUpgrade = "bcd-tunnel"

// TunnelRequest is what a tunnel client asks for.
type TunnelRequest struct {
	Kind    string        // console, ssh, tcp:<port>
	Account string        // the console's account (ssh, tcp, an instance's: who asked)
	TTL     time.Duration // the ticket's lifetime (and the tunnel's)
	// Instance makes it an instance tunnel: to that instance of the node
	// (its serial console, its port 22 or another port of its own
	// address), never to the node itself.
	Instance string
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
