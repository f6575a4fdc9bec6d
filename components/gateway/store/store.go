// Package store is bcgw's state: join tokens, node records, commands with
// their results, each node's desired spec, latest status report and recent
// events, and the gateway's own small values (meta). Store is what the
// gateway uses; Bolt keeps it in one bbolt file under the data directory
// (the default), package pgstore in PostgreSQL. Every write is a
// transaction, durable before it returns.
package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bTokens   = []byte("tokens")
	bNodes    = []byte("nodes")
	bCommands = []byte("commands")
	bPending  = []byte("pending") // node id + "/" + command id -> nil, until a result
	bMeta     = []byte("meta")
	bSpecs    = []byte("specs")   // node id -> Spec
	bReports  = []byte("reports") // node id -> the gateway's record of its latest StatusReport
	bEvents   = []byte("events")  // node id + "/" + %020d seq -> Event
	bAudit    = []byte("audit")   // %020d seq -> AuditEntry
)

// Errors callers distinguish.
var (
	ErrNotFound     = errors.New("not found")
	ErrTokenInvalid = errors.New("join token is not valid")
	ErrTokenSpent   = errors.New("join token has no uses left")
	ErrTokenExpired = errors.New("join token has expired")
	ErrTokenRole    = errors.New("join token does not allow this role")
	// ErrGenerationMoved: a spec was written against a generation that is
	// no longer the stored one.
	ErrGenerationMoved = errors.New("the stored spec generation moved")
)

// Token is a join token's record. The secret is kept only as its SHA-256.
type Token struct {
	ID        string    `json:"id"`
	Hash      string    `json:"hash"`
	Role      string    `json:"role"`
	Site      string    `json:"site"`
	Uses      int       `json:"uses"`
	Used      int       `json:"used"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// MAC and Command bind a discovery token (role ramdisk) to the machine
	// and the boot.prepareRamdisk command it was minted for.
	MAC     string `json:"mac,omitempty"`
	Command string `json:"command,omitempty"`
	// NodeID binds a provisioned token (role node) to the node an
	// installed OS must join as; the deploy.image command it was minted
	// for is Command.
	NodeID string `json:"node_id,omitempty"`
	// CloudAccount (and CloudRegion, when set) make the token a cloud-iid
	// rule: no one holds it (its secret is derived, never shown), and it
	// admits EC2 instances of that account (and region) that prove
	// themselves with their identity document.
	CloudAccount string `json:"cloud_iid_account,omitempty"`
	CloudRegion  string `json:"cloud_iid_region,omitempty"`
}

// Node is a joined agent.
type Node struct {
	ID string `json:"id"`
	// CloudAccount and CloudInstanceID bind a node that joined with the
	// cloud-iid attestor to its EC2 account and instance: an instance is
	// admitted once.
	CloudAccount    string `json:"cloud_iid_account,omitempty"`
	CloudInstanceID string `json:"cloud_iid_instance,omitempty"`
	Role            string `json:"role"`
	Site            string `json:"site"`
	Hostname        string `json:"hostname"`
	SPIFFEID        string `json:"spiffe_id"`
	CertSerial      string `json:"cert_serial"`
	// PrevCertSerial is the certificate a renewal replaced; it stays valid
	// until the new one is first used, so an agent that died before
	// storing its renewed certificate can still connect (and renew again).
	PrevCertSerial string `json:"prev_cert_serial,omitempty"`
	// PublicKey and PrevPublicKey (DER SPKI) are the keys of those two
	// certificates: a site's discovery assertions are checked with them.
	PublicKey     []byte `json:"public_key,omitempty"`
	PrevPublicKey []byte `json:"prev_public_key,omitempty"`
	// MAC is a ramdisk's boot interface (from its discovery token).
	MAC      string    `json:"mac,omitempty"`
	NotAfter time.Time `json:"not_after"`
	Epoch    uint64    `json:"epoch"`
	// Gateway names the gateway holding the node's session (Config.Name),
	// set when it accepts the session and cleared when that session ends;
	// a gateway that dies leaves it until the node's next session. Several
	// gateways on one store read it to say where a node is connected.
	Gateway  string    `json:"gateway,omitempty"`
	Revoked  bool      `json:"revoked"`
	JoinedAt time.Time `json:"joined_at"`
	LastSeen time.Time `json:"last_seen"`
	TokenID  string    `json:"token_id"`
	// AK is the TPM name (hex) of the AK a tpm join proved with credential
	// activation, AKPublic its TPMT_PUBLIC (every renewal's key must be
	// certified by it) and EK the SPKI pin of that TPM's EK.
	AK       string `json:"ak,omitempty"`
	AKPublic []byte `json:"ak_public,omitempty"`
	EK       string `json:"ek,omitempty"`
	// AppliedGeneration and ObservedGeneration are what the agent said in
	// its last Hello or Heartbeat (as of LastSeen): the spec generation it
	// holds, and the one every section last converged or failed at.
	AppliedGeneration  uint64 `json:"applied_generation,omitempty"`
	ObservedGeneration uint64 `json:"observed_generation,omitempty"`
	// InventoryHashes are the inventory section hashes of the last
	// heartbeat that carried any, received at InventoryHashesAt.
	InventoryHashes   map[string]string `json:"inventory_hashes,omitempty"`
	InventoryHashesAt time.Time         `json:"inventory_hashes_at,omitzero"`
	// TrustVersion is the trust bundle version the agent last said it
	// holds (Hello.trust_bundle_version, or a StatusReport acknowledging
	// a newly taken bundle), at TrustVersionAt.
	TrustVersion   uint64    `json:"trust_version,omitempty"`
	TrustVersionAt time.Time `json:"trust_version_at,omitzero"`
	// Version is the bcd version the agent said in its last Hello.
	Version string `json:"version,omitempty"`
}

// Current reports whether a certificate serial may be used by this node:
// its current certificate, or the one a renewal replaced until the new one
// is first used.
func (n Node) Current(serial string) bool {
	return serial != "" && (serial == n.CertSerial || serial == n.PrevCertSerial)
}

// Command states.
const (
	StatePending   = "pending"   // stored, not yet acked by the agent
	StateDelivered = "delivered" // the agent acked receipt
	StateDone      = "done"      // a result is stored
)

// Command is a command and, once it finished, its result.
type Command struct {
	ID         string `json:"id"`
	NodeID     string `json:"node_id"`
	Kind       string `json:"kind"`
	Body       []byte `json:"body,omitempty"`
	DeadlineMS int64  `json:"deadline_unix_ms"`
	Lane       string `json:"lane,omitempty"`
	WorkflowID string `json:"workflow_id,omitempty"`
	// Signature is the Command.signature sent with every copy of the
	// command (components/trust/intent): made once, when the command was
	// created or submitted, so a re-send carries the same bytes.
	Signature []byte `json:"signature,omitempty"`
	// Batch is the Command.batch sent with every copy of the command: its
	// place in an approved batch (the header as signed, the approvals, its
	// index and Merkle proof), kept as submitted so a re-send carries the
	// same leaf.
	Batch     *BatchLeaf `json:"batch,omitempty"`
	State     string     `json:"state"`
	CreatedAt time.Time  `json:"created_at"`
	Result    *Result    `json:"result,omitempty"`
	// ResultCopies counts every copy of the result the agent sent; the
	// first is stored, later ones are acked and ignored.
	ResultCopies int `json:"result_copies,omitempty"`
}

// BatchLeaf is a command's place in a batch (components/trust/quorum).
type BatchLeaf struct {
	Header    []byte   `json:"header"`
	Approvals [][]byte `json:"approvals,omitempty"`
	Index     uint32   `json:"index"`
	Proof     [][]byte `json:"proof,omitempty"`
}

// Result is what the agent reported.
type Result struct {
	Status     string `json:"status"`
	Output     []byte `json:"output,omitempty"`
	Error      string `json:"error,omitempty"`
	StartedMS  int64  `json:"started_unix_ms"`
	FinishedMS int64  `json:"finished_unix_ms"`
	// Attestation is the node key's signature of the result
	// (intent.ResultMessage), kept only when it verified on arrival.
	Attestation []byte `json:"attestation,omitempty"`
}

// Bolt is the Store kept in one bbolt file.
type Bolt struct{ db *bolt.DB }

var _ Store = (*Bolt)(nil)

// Open opens (creating) the bbolt database file.
func Open(path string) (*Bolt, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bTokens, bNodes, bCommands, bPending, bMeta, bSpecs, bReports, bEvents, bAudit} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init %s: %w", path, err)
	}
	return &Bolt{db: db}, nil
}

// Close closes the database.
func (s *Bolt) Close() error { return s.db.Close() }

// Ping answers nil: the file is this process's own.
func (s *Bolt) Ping(context.Context) error { return nil }

func put(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucket).Put([]byte(key), b)
}

func get(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b := tx.Bucket(bucket).Get([]byte(key))
	if b == nil {
		return ErrNotFound
	}
	return json.Unmarshal(b, v)
}

// HashSecret is how token secrets are stored.
func HashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// PutToken stores a new token record.
func (s *Bolt) PutToken(t Token) error {
	return s.db.Update(func(tx *bolt.Tx) error { return put(tx, bTokens, t.ID, t) })
}

// DeleteToken removes a token record (a discovery token replaced by a
// newer one for the same command).
func (s *Bolt) DeleteToken(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bTokens).Delete([]byte(id)) })
}

// SpendToken checks the token id and secret, its role and expiry, and uses
// it once, all in one transaction.
func (s *Bolt) SpendToken(id, secret, role string, now time.Time) (Token, error) {
	return s.SpendTokenIf(id, secret, role, now, nil)
}

// SpendTokenIf is SpendToken with one more check of the token, made in the
// same transaction before the use is counted: a join the check refuses
// leaves the token as it was. check must not use the store.
func (s *Bolt) SpendTokenIf(id, secret, role string, now time.Time, check func(Token) error) (Token, error) {
	var t Token
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := get(tx, bTokens, id, &t); err != nil {
			return ErrTokenInvalid
		}
		if subtle.ConstantTimeCompare([]byte(t.Hash), []byte(HashSecret(secret))) != 1 {
			return ErrTokenInvalid
		}
		if !t.ExpiresAt.IsZero() && now.After(t.ExpiresAt) {
			return ErrTokenExpired
		}
		if t.Used >= t.Uses {
			return ErrTokenSpent
		}
		if t.Role != role {
			return ErrTokenRole
		}
		if check != nil {
			if err := check(t); err != nil {
				return err
			}
		}
		t.Used++
		return put(tx, bTokens, t.ID, t)
	})
	return t, err
}

// PutNode creates or replaces a node record.
func (s *Bolt) PutNode(n Node) error {
	return s.db.Update(func(tx *bolt.Tx) error { return put(tx, bNodes, n.ID, n) })
}

// Node returns one node.
func (s *Bolt) Node(id string) (Node, error) {
	var n Node
	err := s.db.View(func(tx *bolt.Tx) error { return get(tx, bNodes, id, &n) })
	return n, err
}

// Nodes lists every node by id.
func (s *Bolt) Nodes() ([]Node, error) {
	var out []Node
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bNodes).ForEach(func(k, v []byte) error {
			var n Node
			if err := json.Unmarshal(v, &n); err != nil {
				return fmt.Errorf("node %s: %w", k, err)
			}
			out = append(out, n)
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

// UpdateNode applies f to a node in one transaction.
func (s *Bolt) UpdateNode(id string, f func(*Node) error) (Node, error) {
	var n Node
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := get(tx, bNodes, id, &n); err != nil {
			return err
		}
		if err := f(&n); err != nil {
			return err
		}
		return put(tx, bNodes, id, n)
	})
	return n, err
}

// AddCommand stores a new pending command.
func (s *Bolt) AddCommand(c Command) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bNodes).Get([]byte(c.NodeID)) == nil {
			return fmt.Errorf("node %s: %w", c.NodeID, ErrNotFound)
		}
		if tx.Bucket(bCommands).Get([]byte(c.ID)) != nil {
			return fmt.Errorf("command %s already exists", c.ID)
		}
		c.State = StatePending
		if err := put(tx, bCommands, c.ID, c); err != nil {
			return err
		}
		return tx.Bucket(bPending).Put([]byte(c.NodeID+"/"+c.ID), nil)
	})
}

// Command returns one command.
func (s *Bolt) Command(id string) (Command, error) {
	var c Command
	err := s.db.View(func(tx *bolt.Tx) error { return get(tx, bCommands, id, &c) })
	return c, err
}

// Unfinished lists a node's commands that have no result yet, oldest first.
func (s *Bolt) Unfinished(nodeID string) ([]Command, error) {
	var out []Command
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bPending).Cursor()
		prefix := []byte(nodeID + "/")
		for k, _ := c.Seek(prefix); k != nil && len(k) > len(prefix) && string(k[:len(prefix)]) == string(prefix); k, _ = c.Next() {
			var cmd Command
			if err := get(tx, bCommands, string(k[len(prefix):]), &cmd); err != nil {
				return err
			}
			out = append(out, cmd)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, err
}

// MarkDelivered records that the agent acked receipt of a command.
func (s *Bolt) MarkDelivered(nodeID, id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		var c Command
		if err := get(tx, bCommands, id, &c); err != nil {
			return err
		}
		if c.NodeID != nodeID || c.State != StatePending {
			return nil
		}
		c.State = StateDelivered
		return put(tx, bCommands, id, c)
	})
}

// SetResult stores a command's result once; a repeated result for the same
// command is accepted and ignored (the agent re-sends until acked). It
// reports whether this was the first result.
func (s *Bolt) SetResult(nodeID, id string, r Result) (bool, error) {
	first := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		var c Command
		if err := get(tx, bCommands, id, &c); err != nil {
			return err
		}
		if c.NodeID != nodeID {
			return fmt.Errorf("command %s is not for node %s", id, nodeID)
		}
		c.ResultCopies++
		if c.Result != nil {
			return put(tx, bCommands, id, c)
		}
		first = true
		c.Result, c.State = &r, StateDone
		if err := put(tx, bCommands, id, c); err != nil {
			return err
		}
		return tx.Bucket(bPending).Delete([]byte(nodeID + "/" + id))
	})
	return first, err
}

// CancelPending ends a command the agent has not acked yet with a
// CANCELLED result and reports true; for a delivered or finished command it
// changes nothing and reports false.
func (s *Bolt) CancelPending(id, reason string, now time.Time) (Command, bool, error) {
	var c Command
	done := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := get(tx, bCommands, id, &c); err != nil {
			return err
		}
		if c.State != StatePending {
			return nil
		}
		c.Result = &Result{Status: "CANCELLED", Error: reason, StartedMS: now.UnixMilli(), FinishedMS: now.UnixMilli()}
		c.State, done = StateDone, true
		if err := put(tx, bCommands, id, c); err != nil {
			return err
		}
		return tx.Bucket(bPending).Delete([]byte(c.NodeID + "/" + id))
	})
	return c, done, err
}

// StartSession takes the node's next epoch and applies f in one
// transaction (a bbolt file has one gateway: there is no notice to send).
func (s *Bolt) StartSession(nodeID string, f func(*Node) error) (Node, error) {
	return s.UpdateNode(nodeID, func(n *Node) error {
		n.Epoch++
		return f(n)
	})
}

// SessionState reads the node's report, unfinished commands and spec
// (three reads of the one file: each is a memory-mapped lookup).
func (s *Bolt) SessionState(nodeID string) (SessionState, error) {
	var st SessionState
	var err error
	if st.Spec, err = s.Spec(nodeID); err != nil {
		return SessionState{}, err
	}
	if st.Report, err = s.Report(nodeID); err != nil {
		return SessionState{}, err
	}
	if st.Unfinished, err = s.Unfinished(nodeID); err != nil {
		return SessionState{}, err
	}
	return st, nil
}

// Meta reads a small value of the gateway's own.
func (s *Bolt) Meta(key string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bMeta).Get([]byte(key)); v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	return out, err
}

// DeleteMetaPrefix deletes every value of the gateway's own whose key
// starts with prefix.
func (s *Bolt) DeleteMetaPrefix(prefix string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		c := tx.Bucket(bMeta).Cursor()
		p := []byte(prefix)
		for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Seek(p) {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteMeta deletes one value of the gateway's own.
func (s *Bolt) DeleteMeta(key string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bMeta).Delete([]byte(key)) })
}

// SetMeta writes a small value of the gateway's own.
func (s *Bolt) SetMeta(key string, v []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bMeta).Put([]byte(key), v) })
}

// SwapMeta sets key to v while its value is old (nil: absent), read and
// written in one Update.
func (s *Bolt) SwapMeta(key string, old, v []byte) (bool, error) {
	if v == nil {
		v = []byte{}
	}
	var swapped bool
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bMeta)
		cur := b.Get([]byte(key))
		if (old == nil) != (cur == nil) || !bytes.Equal(cur, old) {
			return nil
		}
		swapped = true
		return b.Put([]byte(key), v)
	})
	return swapped, err
}

// MetaPrefix returns every value of the gateway's own whose key starts
// with prefix, by key.
func (s *Bolt) MetaPrefix(prefix string) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bMeta).Cursor()
		p := []byte(prefix)
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			out[string(k)] = append([]byte(nil), v...)
		}
		return nil
	})
	return out, err
}

// ---- desired spec ----

// ---- status reports ----

// ---- events ----
