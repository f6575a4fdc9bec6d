package store

import "time"

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
//     other change to that node in between.
type Store interface {
	// Close releases the backend (the file, the connection pool).
	Close() error

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
	NextEpoch(nodeID string, seen time.Time) (uint64, error)

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
}
