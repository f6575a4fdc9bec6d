package store

import (
	"context"
	"encoding/json"
	"time"
)

// Store is everything bcgw keeps. Each method is one transaction: it
// either happens whole or not at all, and is durable when it returns.
// The exactly-once rules every backend keeps (the shared suite in
// package storetest checks them):
//
//   - SpendToken/SpendTokenIf count a use only when every check passed,
//     and two spenders of a token's last use cannot both succeed;
//   - SetResult stores the first result of a command and only counts
//     later copies, whoever sends them;
//   - AddEvent stores an event once per (node, seq);
//   - PutSpec/PutSubmittedSpec write generation base+1 only while the
//     stored generation is still base (compare-and-swap), so of two
//     writers on one base exactly one wins;
//   - UpdateNode applies its function to the node as stored, with no
//     other change to that node in between;
//   - SwapMeta writes only over the value it was given, so of two
//     writers from one value exactly one wins.
//
// A method added here also needs its timed copy in timed.go (the
// gateway's store latency metric).
type Store interface {
	// Close releases the backend (the file, the connection pool).
	Close() error
	// Ping checks that the backend answers (the gateway's health).
	Ping(ctx context.Context) error

	// Join tokens.
	PutToken(t Token) error
	DeleteToken(id string) error
	SpendToken(id, secret, role string, now time.Time) (Token, error)
	// SpendTokenIf is SpendToken with one more check of the token made in
	// the same transaction before the use is counted; check must not use
	// the store.
	SpendTokenIf(id, secret, role string, now time.Time, check func(Token) error) (Token, error)

	// Nodes.
	PutNode(n Node) error
	Node(id string) (Node, error)
	Nodes() ([]Node, error)
	// UpdateNode applies f to the node in one transaction; f must not use
	// the store.
	UpdateNode(id string, f func(*Node) error) (Node, error)
	// StartSession begins a session of the node in one transaction: it
	// takes the node's next epoch, applies f to the record (which holds
	// the new epoch; f must not use the store), and on a shared store
	// sends the session notice naming that epoch once it is committed.
	StartSession(nodeID string, f func(*Node) error) (Node, error)
	// SessionState reads what a new session of the node is sent, in one
	// read (one round trip on PostgreSQL): its status report record, its
	// unfinished commands and its desired spec; ErrNotFound for a node
	// the store does not know.
	SessionState(nodeID string) (SessionState, error)

	// Commands and results.
	AddCommand(c Command) error
	Command(id string) (Command, error)
	Unfinished(nodeID string) ([]Command, error)
	MarkDelivered(nodeID, id string) error
	SetResult(nodeID, id string, r Result) (bool, error)
	CancelPending(id, reason string, now time.Time) (Command, bool, error)

	// The gateway's own small values: secrets' bookkeeping, BMC
	// credentials, trust bundles, site state.
	Meta(key string) ([]byte, error)
	SetMeta(key string, v []byte) error
	// SwapMeta sets key to v only while its stored value is old (nil
	// old: while key is absent), and reports whether it did: a
	// compare-and-swap, so of two writers from one old value exactly one
	// wins (the trust bundle's versions, trust.go).
	SwapMeta(key string, old, v []byte) (bool, error)
	DeleteMeta(key string) error
	MetaPrefix(prefix string) (map[string][]byte, error)
	DeleteMetaPrefix(prefix string) error

	// Desired specs.
	Spec(nodeID string) (Spec, error)
	PutSpec(nodeID string, base uint64, spec []byte, at time.Time) (Spec, error)
	PutSubmittedSpec(nodeID string, base uint64, spec, sig []byte, at time.Time) (Spec, error)

	// Status reports.
	PutReport(nodeID string, rec []byte) error
	Report(nodeID string) ([]byte, error)

	// Events.
	AddEvent(nodeID string, e Event, keep int) (bool, error)
	Events(nodeID string, after uint64) ([]Event, error)
	DeleteEvents(nodeID string) error

	// The fleet at a glance and day-2 work (audit.go).
	// RecentCommands lists the newest commands of every node, newest
	// first, at most limit.
	RecentCommands(limit int) ([]Command, error)
	// Tokens lists the join tokens by id.
	Tokens() ([]Token, error)
	// DeleteNode forgets a node with its commands, spec, report and
	// events; ErrNotFound for a node the store does not know.
	DeleteNode(id string) error
	// AddAudit appends an entry to the audit trail with the next seq,
	// and returns it as stored.
	AddAudit(e AuditEntry) (AuditEntry, error)
	// Audit lists the entries after seq after, oldest first, at most
	// limit (0: all).
	Audit(after uint64, limit int) ([]AuditEntry, error)
}

// SessionState is what a new session of a node is sent: the node's
// stored status report record (nil without one, as Report), its commands
// without a result oldest first (as Unfinished), and its desired spec (as
// Spec).
type SessionState struct {
	Report     []byte
	Unfinished []Command
	Spec       Spec
}

// Notice is what one gateway tells every gateway sharing its store: that
// a command was stored for a node, that a command ended, that a delivered
// command is to be cancelled, that a node's session moved, that a node
// was revoked. A notice only says where to look: the store stays the
// truth, and a notice lost is made up for by the next read.
type Notice struct {
	Kind    string `json:"k"`
	Node    string `json:"n,omitempty"`
	Command string `json:"c,omitempty"`
	Epoch   uint64 `json:"e,omitempty"`
	Reason  string `json:"r,omitempty"`
	// Detail and At are a running command's progress (NoticeProgress).
	Detail json.RawMessage `json:"d,omitempty"`
	At     time.Time       `json:"t,omitzero"`
}

// The kinds of Notice.
const (
	NoticeCommand = "command" // Command was stored for Node (sent by AddCommand)
	NoticeResult  = "result"  // Command ended (sent by SetResult's first copy, CancelPending)
	NoticeCancel  = "cancel"  // Command, delivered to Node, is cancelled (Reason)
	NoticeSession = "session" // Node's session Epoch started on some gateway
	NoticeRevoke  = "revoke"  // Node was revoked
	NoticeSpec    = "spec"    // Node's desired spec changed on a gateway without its session
	NoticeTrust   = "trust"   // the trust bundle changed (the others load it and drain)
	// NoticeProgress: Node reported progress (Detail, At) of its running
	// Command, so every gateway's command view shows it.
	NoticeProgress = "progress"
)

// Shared is implemented by a store several gateways use at once (the
// PostgreSQL store; a bbolt file has one gateway). Besides the records it
// carries notices between the gateways and keeps what must have one owner
// across them.
type Shared interface {
	// Listen calls f with every notice any gateway sends (its own
	// included) until ctx ends (nil) or its connection fails (the error:
	// the caller listens again). synced is called once it listens; notices
	// sent while nobody listened are lost, so the caller then reads what
	// it may have missed.
	Listen(ctx context.Context, f func(Notice), synced func()) error
	// Notify sends a notice to every gateway.
	Notify(n Notice) error
	// Pending lists the commands for nodes not yet acked by their node,
	// oldest first, at most limit (a safety net for lost notices: a
	// gateway asks for the nodes whose sessions it holds).
	Pending(nodes []string, limit int) ([]Command, error)
	// TouchLease grants the lease name to holder when it is free or
	// expired at now, and renews it for ttl when holder has it. It reports
	// whether holder has it, until when, and whether the holder changed.
	TouchLease(name, holder string, now time.Time, ttl time.Duration) (held bool, until time.Time, changed bool, err error)
	// LeaseHolder returns the lease's holder at now ("" when free).
	LeaseHolder(name string, now time.Time) (string, error)
}

// SealedKey is one of the gateway's long-lived keys as a KeyStore keeps
// it: sealed under the fleet's key-encryption key (components/gateway/kek),
// so the store alone opens none of them.
type SealedKey struct {
	// Name is the key's file name in a data directory (serving-ca.key,
	// join-signing.key, ...).
	Name string
	// Version is bound into the seal: 1 when the set is made, one more
	// at each rotation of that key (RotateKey; the command-signing key).
	Version uint32
	Sealed  []byte
}

// KeyStore is implemented by a store that keeps the gateway's long-lived
// keys for every gateway sharing it (the PostgreSQL store). The bbolt
// store does not: its one gateway keeps its keys as files in its data
// directory.
type KeyStore interface {
	// Keys returns the fingerprint of the key-encryption key the stored
	// keys are sealed under, and the keys by name; ErrNotFound when no
	// key set was stored.
	Keys() (kekFingerprint string, keys []SealedKey, err error)
	// AddKeysIfAbsent stores a key set and its key-encryption key's
	// fingerprint in one transaction when none is stored, and reports
	// whether it did. When a set is stored already (another gateway's,
	// even one being stored at this moment) it changes nothing and
	// reports false: of gateways starting together on an empty store,
	// one set wins and every gateway reads it back.
	AddKeysIfAbsent(kekFingerprint string, keys []SealedKey) (bool, error)
	// ResealKeys replaces the stored key set, sealed anew under another
	// key-encryption key, in one transaction, only while the stored set
	// is sealed under oldFingerprint, and reports whether it did: of two
	// rotations from one key-encryption key exactly one wins. keys must
	// name exactly the stored keys, each at its stored version: a key
	// rotated meanwhile (RotateKey) makes it change nothing.
	ResealKeys(oldFingerprint, newFingerprint string, keys []SealedKey) (bool, error)
	// RotateKey replaces one stored key with next (sealed under
	// kekFingerprint, next.Version one more than the stored version) and
	// sets the meta value metaKey from old to v (as SwapMeta), in one
	// transaction, only while the set is sealed under kekFingerprint, the
	// key is at version next.Version-1 and the value is old; it reports
	// whether it did. The key and the value (the trust bundle naming the
	// new key as a root) move together: of two rotations from one version
	// exactly one wins, and a bundle changed meanwhile makes it change
	// nothing.
	RotateKey(kekFingerprint string, next SealedKey, metaKey string, old, v []byte) (bool, error)
}
