package adminapi

import "time"

// Certificate lifetimes bcgw ssh-sign issues.
const (
	DefaultCertTTL = 15 * time.Minute
	MaxCertTTL     = 12 * time.Hour
)

// SSHCARequest is `bcgw ssh-ca`: the nodes whose access section gets the
// user CA and the ticket JWKS, the local accounts given principals there
// (NODE:ACCOUNT each, bound to the node), and serials to revoke.
type SSHCARequest struct {
	Nodes    []string `json:"nodes,omitempty"`
	Accounts []string `json:"accounts,omitempty"`
	Revoke   []uint64 `json:"revoke,omitempty"`
	// JWKSOnly puts only the exec-ticket JWKS (tunnels to TCP ports and
	// consoles on a node without sshd).
	JWKSOnly bool `json:"jwks_only,omitempty"`
}

// SSHCAView is the answer: the CA's public key and each node's new
// generation.
type SSHCAView struct {
	PublicKey   string            `json:"public_key"`
	Generations map[string]uint64 `json:"generations,omitempty"`
}

// Principal is the principal a node's account accepts: NODE:ACCOUNT, so a
// certificate for one node opens no other.
func Principal(node, account string) string { return node + ":" + account }

// SSHSignRequest is `bcgw ssh-sign`.
type SSHSignRequest struct {
	Principal  string `json:"principal"`
	PublicKey  string `json:"public_key"` // authorized_keys form
	TTLSeconds int64  `json:"ttl_seconds,omitempty"`
}

// SSHSignView is the certificate (authorized_keys form) and its serial.
type SSHSignView struct {
	Certificate string `json:"certificate"`
	Serial      uint64 `json:"serial"`
	ValidBefore int64  `json:"valid_before"`
}
