package journal

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/better-compute/bcd/components/base/filehash"
)

// The bbolt journal of the releases before the write-ahead log
// (journal.db beside the journal's directory): buckets meta, commands
// (id -> Entry as JSON) and events (big-endian seq -> Event as JSON); the
// index buckets (open, unacked) are rebuilt from the entries. A node that
// updates itself into this release brings that file; Open imports it once
// into the first snapshot and then moves it aside.
var (
	bMeta     = []byte("meta")
	bCommands = []byte("commands")
	bEvents   = []byte("events")
	kNodeID   = []byte("node_id")
	kEventSeq = []byte("event_seq")
	kEventAck = []byte("event_ack")
	kDropped  = []byte("events_dropped")
)

func u64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// importLegacy reads the bbolt journal at path into a state. A file bbolt
// cannot read is errCorrupt; another node's journal is ErrOtherNode.
func importLegacy(path, nodeID string) (st *state, err error) {
	// bbolt panics on some corrupt files instead of returning an error.
	defer func() {
		if r := recover(); r != nil {
			st, err = nil, errCorrupt{fmt.Errorf("%s: %v", path, r)}
		}
	}()
	sum, err := filehash.SHA256(path)
	if err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, ReadOnly: true})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("open %s: %w (is another bcd running on this data directory?)", path, err)
	}
	if err != nil {
		return nil, errCorrupt{fmt.Errorf("open %s: %w", path, err)}
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return errCorrupt{fmt.Errorf("%s: bbolt check: %w", path, err)}
		}
		m := tx.Bucket(bMeta)
		if m == nil {
			return errCorrupt{fmt.Errorf("%s: no meta bucket", path)}
		}
		node := string(m.Get(kNodeID))
		if node == "" {
			node = nodeID
		}
		if err := nodeCheck(node, nodeID); err != nil {
			return err
		}
		st = newState(node)
		st.apply(&change{Head: &head{Node: node, EventSeq: u64(m.Get(kEventSeq)), EventAck: u64(m.Get(kEventAck)), Dropped: u64(m.Get(kDropped)), Imported: sum}})
		if b := tx.Bucket(bCommands); b != nil {
			if err := b.ForEach(func(k, v []byte) error {
				var e Entry
				if err := json.Unmarshal(v, &e); err != nil {
					return errCorrupt{fmt.Errorf("%s: entry %s: %w", path, k, err)}
				}
				e.ID = string(k)
				if err := checkEntry(&e); err != nil {
					return errCorrupt{fmt.Errorf("%s: %w", path, err)}
				}
				st.apply(&change{Put: &e})
				return nil
			}); err != nil {
				return err
			}
		}
		if b := tx.Bucket(bEvents); b != nil {
			return b.ForEach(func(k, v []byte) error {
				var e Event
				if err := json.Unmarshal(v, &e); err != nil {
					return errCorrupt{fmt.Errorf("%s: event %x: %w", path, k, err)}
				}
				if e.Seq <= st.eventAck {
					return nil // acked; the old code deleted these in the same transaction
				}
				st.apply(&change{Event: &e})
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}
