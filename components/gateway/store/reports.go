package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Spec is a node's desired spec: the full NodeSpec (canonical JSON) at
// its generation. Generation 0 means the node has none yet; every change
// is the next generation.
type Spec struct {
	Generation uint64    `json:"generation"`
	Spec       []byte    `json:"spec,omitempty"` // exact bytes (raw JSON would be re-escaped)
	UpdatedAt  time.Time `json:"updated_at,omitzero"`
	// Submitted: this generation's full spec came pre-signed (or
	// deliberately unsigned) with bcgw spec submit, and every full copy
	// of it carries Signature as it came; the gateway does not sign it.
	Submitted bool   `json:"submitted,omitempty"`
	Signature []byte `json:"signature,omitempty"`
}

// Spec returns a node's desired spec (generation 0 and no spec when it has
// none); ErrNotFound for a node the store does not know.
func (s *Bolt) Spec(nodeID string) (Spec, error) {
	var sp Spec
	err := s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bNodes).Get([]byte(nodeID)) == nil {
			return fmt.Errorf("node %s: %w", nodeID, ErrNotFound)
		}
		if err := get(tx, bSpecs, nodeID, &sp); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		return nil
	})
	return sp, err
}

// PutSpec stores spec (valid JSON) as the node's next generation, provided
// the stored generation is still base (ErrGenerationMoved otherwise), and
// returns the new record.
func (s *Bolt) PutSpec(nodeID string, base uint64, spec []byte, at time.Time) (Spec, error) {
	return s.putSpec(nodeID, base, Spec{Spec: spec, UpdatedAt: at})
}

// PutSubmittedSpec is PutSpec for a full spec submitted with its
// signature sig (nil: submitted unsigned), kept with it.
func (s *Bolt) PutSubmittedSpec(nodeID string, base uint64, spec, sig []byte, at time.Time) (Spec, error) {
	return s.putSpec(nodeID, base, Spec{Spec: spec, UpdatedAt: at, Submitted: true, Signature: sig})
}

func (s *Bolt) putSpec(nodeID string, base uint64, next Spec) (Spec, error) {
	var sp Spec
	err := s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bNodes).Get([]byte(nodeID)) == nil {
			return fmt.Errorf("node %s: %w", nodeID, ErrNotFound)
		}
		if err := get(tx, bSpecs, nodeID, &sp); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if sp.Generation != base {
			return fmt.Errorf("%w: %d, not %d", ErrGenerationMoved, sp.Generation, base)
		}
		sp = next
		sp.Generation, sp.Spec = base+1, append([]byte(nil), next.Spec...)
		if len(next.Signature) > 0 {
			sp.Signature = append([]byte(nil), next.Signature...)
		}
		return put(tx, bSpecs, nodeID, sp)
	})
	return sp, err
}

// PutReport replaces a node's latest status report record (the gateway's
// own JSON).
func (s *Bolt) PutReport(nodeID string, rec []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bNodes).Get([]byte(nodeID)) == nil {
			return fmt.Errorf("node %s: %w", nodeID, ErrNotFound)
		}
		return tx.Bucket(bReports).Put([]byte(nodeID), rec)
	})
}

// Report returns a node's latest status report record, nil when there is
// none.
func (s *Bolt) Report(nodeID string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bReports).Get([]byte(nodeID)); v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	return out, err
}

// Event is an event an agent reported, as stored.
type Event struct {
	Seq        uint64    `json:"seq"`
	Type       string    `json:"type"`
	Body       []byte    `json:"body,omitempty"`
	AtUnixMS   int64     `json:"at_unix_ms"`
	ReceivedAt time.Time `json:"received_at"`
	// BodyDropped is the size of a body too large to keep (Body is then
	// empty).
	BodyDropped int `json:"body_dropped,omitempty"`
}

func eventKey(nodeID string, seq uint64) []byte {
	return fmt.Appendf(nil, "%s/%020d", nodeID, seq)
}

// AddEvent stores a node's event once per seq and keeps only the keep
// events of highest seq. It reports whether e is stored now: false for a
// seq already stored (the agent re-sent it), or one older than every
// event kept.
func (s *Bolt) AddEvent(nodeID string, e Event, keep int) (bool, error) {
	stored := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bNodes).Get([]byte(nodeID)) == nil {
			return fmt.Errorf("node %s: %w", nodeID, ErrNotFound)
		}
		b := tx.Bucket(bEvents)
		k := eventKey(nodeID, e.Seq)
		if b.Get(k) != nil {
			return nil
		}
		if err := put(tx, bEvents, string(k), e); err != nil {
			return err
		}
		// Prune the oldest beyond keep.
		prefix := []byte(nodeID + "/")
		n := 0
		c := b.Cursor()
		for ck, _ := c.Seek(prefix); ck != nil && bytes.HasPrefix(ck, prefix); ck, _ = c.Next() {
			n++
		}
		for ck, _ := c.Seek(prefix); n > keep && ck != nil && bytes.HasPrefix(ck, prefix); ck, _ = c.Seek(prefix) {
			if err := c.Delete(); err != nil {
				return err
			}
			n--
		}
		stored = b.Get(k) != nil
		return nil
	})
	return stored, err
}

// Events lists a node's stored events with a seq above after, oldest
// first; ErrNotFound for a node the store does not know.
func (s *Bolt) Events(nodeID string, after uint64) ([]Event, error) {
	out := []Event{}
	err := s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bNodes).Get([]byte(nodeID)) == nil {
			return fmt.Errorf("node %s: %w", nodeID, ErrNotFound)
		}
		prefix := []byte(nodeID + "/")
		c := tx.Bucket(bEvents).Cursor()
		for k, v := c.Seek(eventKey(nodeID, after)); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			var e Event
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("event %s: %w", k, err)
			}
			if e.Seq > after {
				out = append(out, e)
			}
		}
		return nil
	})
	return out, err
}

// DeleteEvents forgets a node's events (a provisioned join replaced the
// node: its new agent counts from 1 again).
func (s *Bolt) DeleteEvents(nodeID string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		c := tx.Bucket(bEvents).Cursor()
		p := []byte(nodeID + "/")
		for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Seek(p) {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}
