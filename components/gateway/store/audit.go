package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

// AuditEntry is one admin API call that changed (or tried to change)
// state: who made it, what it was, on what, and how it ended.
type AuditEntry struct {
	Seq uint64    `json:"seq"`
	At  time.Time `json:"at"`
	// Actor is the name of the admin token the call came with ("socket"
	// for the admin socket, which needs none).
	Actor string `json:"actor"`
	// Gateway names the gateway that served the call.
	Gateway string `json:"gateway,omitempty"`
	// Action names the call (spec.set, node.revoke, ...); Target what it
	// was on (a node, a command, a token name), when it names one.
	Action string `json:"action"`
	Target string `json:"target,omitempty"`
	// Status is the HTTP status of the answer; Error its error, if any.
	Status int    `json:"status"`
	Error  string `json:"error,omitempty"`
}

// RecentCommands lists the newest commands, newest first, at most limit.
// It reads every command (bbolt keys them by random id): fine for a lab
// gateway's thousands.
func (s *Bolt) RecentCommands(limit int) ([]Command, error) {
	var out []Command
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bCommands).ForEach(func(k, v []byte) error {
			var c Command
			if err := get(tx, bCommands, string(k), &c); err != nil {
				return fmt.Errorf("command %s: %w", k, err)
			}
			out = append(out, c)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	SortNewest(out)
	if limit >= 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// SortNewest orders commands newest first (ties by id), as every
// backend's RecentCommands returns them.
func SortNewest(cs []Command) {
	sort.Slice(cs, func(i, j int) bool {
		if !cs[i].CreatedAt.Equal(cs[j].CreatedAt) {
			return cs[i].CreatedAt.After(cs[j].CreatedAt)
		}
		return cs[i].ID > cs[j].ID
	})
}

// Tokens lists the join tokens by id.
func (s *Bolt) Tokens() ([]Token, error) {
	var out []Token
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bTokens).ForEach(func(k, _ []byte) error {
			var t Token
			if err := get(tx, bTokens, string(k), &t); err != nil {
				return fmt.Errorf("token %s: %w", k, err)
			}
			out = append(out, t)
			return nil
		})
	})
	return out, err
}

// DeleteNode forgets a node with its commands, spec, report and events.
func (s *Bolt) DeleteNode(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bNodes).Get([]byte(id)) == nil {
			return fmt.Errorf("node %s: %w", id, ErrNotFound)
		}
		var gone [][]byte
		err := tx.Bucket(bCommands).ForEach(func(k, v []byte) error {
			var c Command
			if err := get(tx, bCommands, string(k), &c); err != nil {
				return err
			}
			if c.NodeID == id {
				gone = append(gone, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range gone {
			if err := tx.Bucket(bCommands).Delete(k); err != nil {
				return err
			}
		}
		p := []byte(id + "/")
		for _, b := range [][]byte{bPending, bEvents} {
			c := tx.Bucket(b).Cursor()
			for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Seek(p) {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		for _, b := range [][]byte{bSpecs, bReports, bNodes} {
			if err := tx.Bucket(b).Delete([]byte(id)); err != nil {
				return err
			}
		}
		return nil
	})
}

// AddAudit appends an audit entry with the bucket's next sequence.
func (s *Bolt) AddAudit(e AuditEntry) (AuditEntry, error) {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bAudit)
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		e.Seq = seq
		return put(tx, bAudit, string(binary.BigEndian.AppendUint64(nil, seq)), e)
	})
	return e, err
}

// Audit lists the entries after seq after, oldest first, at most limit.
func (s *Bolt) Audit(after uint64, limit int) ([]AuditEntry, error) {
	var out []AuditEntry
	if after == math.MaxUint64 {
		return nil, nil
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bAudit).Cursor()
		for k, v := c.Seek(binary.BigEndian.AppendUint64(nil, after+1)); k != nil; k, v = c.Next() {
			if limit > 0 && len(out) == limit {
				break
			}
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("audit entry %d: %w", binary.BigEndian.Uint64(k), err)
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// Backup writes a consistent copy of the whole bbolt file to w while the
// store serves (one read transaction), and returns its size: what `bcgw
// backup` streams.
func (s *Bolt) Backup(w io.Writer) (int64, error) {
	var n int64
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	return n, err
}

// CheckBolt opens a bbolt file read-only and checks it holds the store's
// buckets: a backup that did not arrive whole fails here.
func CheckBolt(path string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bTokens, bNodes, bCommands, bMeta} {
			if tx.Bucket(b) == nil {
				return fmt.Errorf("%s holds no %s bucket: not a bcgw store", path, b)
			}
		}
		return nil
	})
}
