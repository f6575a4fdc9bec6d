package adminapi

import (
	"encoding/json"
	"time"
)

// AdminSocket is the admin API's unix socket under the data directory
// (0600: only the account that runs bcgw may use it).
const AdminSocket = "admin.sock"

// AdminTokenFile holds the bearer token of the loopback admin listener.
const AdminTokenFile = "admin.token"

// NodeView is a node as the admin API lists it.
type NodeView struct {
	ID       string `json:"id"`
	Role     string `json:"role"`
	Site     string `json:"site"`
	Hostname string `json:"hostname"`
	// Connected is true while a gateway holds the node's session: this
	// one, or on a shared database the one Gateway names.
	Connected bool      `json:"connected"`
	Gateway   string    `json:"gateway,omitempty"`
	BootLease bool      `json:"boot_lease,omitempty"` // a site agent holding its site's boot lease
	Epoch     uint64    `json:"epoch"`
	Revoked   bool      `json:"revoked"`
	LastSeen  time.Time `json:"last_seen"`
	NotAfter  time.Time `json:"not_after"`
	AK        string    `json:"ak,omitempty"`      // the TPM name (hex) of the AK a tpm join proved
	Version   string    `json:"version,omitempty"` // the bcd version of its last Hello
}

// TokenRequest asks for a join token.
type TokenRequest struct {
	Role       string `json:"role"`
	Site       string `json:"site"`
	Uses       int    `json:"uses"`
	TTLSeconds int    `json:"ttl_seconds"`
	// NodeID makes a provisioned token (role node, one use): the OS that
	// joins with it (`bcd join --node-id`) becomes that node.
	NodeID string `json:"node_id,omitempty"`
	// CloudAccount makes a cloud-iid rule: EC2 instances of this account
	// (and of CloudRegion, when set) join with bcd join --attestor
	// cloud-iid, up to Uses of them. No token is shown.
	CloudAccount string `json:"cloud_iid_account,omitempty"`
	CloudRegion  string `json:"cloud_iid_region,omitempty"`
}

// TokenResponse carries a new token, shown once.
type TokenResponse struct {
	Token     string    `json:"token"`
	ID        string    `json:"id"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// CommandRequest sends a command.
type CommandRequest struct {
	Node            string          `json:"node"`
	Kind            string          `json:"kind"`
	Body            json.RawMessage `json:"body,omitempty"`
	DeadlineSeconds int             `json:"deadline_seconds"`
	// UserData is deploy.image's user data (cloud-init NoCloud or
	// Ignition): a secret bound to the command, fetched by the ramdisk
	// with a SecretRequest, never part of the body.
	UserData []byte `json:"user_data,omitempty"`
	// SecretHeaders are site.httpProxy's secret header values by name
	// (a BMC's Authorization): secrets bound to the command, fetched by
	// the site agent, never part of the body.
	SecretHeaders map[string]string `json:"secret_headers,omitempty"`
}

// CommandView is a command and its result as the admin API shows it.
type CommandView struct {
	ID       string          `json:"id"`
	Node     string          `json:"node"`
	Kind     string          `json:"kind"`
	State    string          `json:"state"`
	Status   string          `json:"status,omitempty"`
	Output   json.RawMessage `json:"output,omitempty"`
	Error    string          `json:"error,omitempty"`
	Deadline time.Time       `json:"deadline"`
	// ResultCopies is how many copies of the result arrived (re-sends
	// until acked); the first one is the result.
	ResultCopies int `json:"result_copies,omitempty"`
	// Progress is the agent's latest CommandProgress of a running
	// command (JSON of the kind's own shape), and when it came.
	Progress   json.RawMessage `json:"progress,omitempty"`
	ProgressAt *time.Time      `json:"progress_at,omitempty"`
	// Signed: the command carries a signature (bcgw's own, or the one it
	// was submitted with).
	Signed bool `json:"signed,omitempty"`
	// Batch is the command's place in a batch (bcgw batch submit).
	Batch *CommandBatch `json:"batch,omitempty"`
	// Attested: the node key signed this result (a destructive kind's
	// SUCCEEDED result), and the signature verified; Attestation is it.
	Attested    bool   `json:"attested,omitempty"`
	Attestation []byte `json:"attestation,omitempty"`
	// Warning, in the answer to a sent or submitted command, says why
	// agents that hold the current trust bundle will refuse it.
	Warning string `json:"warning,omitempty"`
}

// CommandBatch is a command's place in a batch: the batch id and the
// command's leaf index.
type CommandBatch struct {
	ID    string `json:"id"`
	Index uint32 `json:"index"`
}
