package journal

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/better-compute/bcd/components/agent/journal/wal"
)

// A node that updates itself into this release imports the bbolt
// journal.db of the release before (import.go). When that update is
// rolled back (the new release did not confirm, docs/update.md), the
// release before starts again and opens journal.db. It cannot read the
// journal's directory; finding no journal.db it would start an empty
// journal, and forget the commands it accepted and the results the
// gateway has not acked, or run again, after the gateway replays them,
// commands this release ran. So journal.db is not only moved aside: a
// tombstone takes its place, a bbolt journal whose node id is a sentence.
// The release before then refuses to start, with that sentence in its
// error ("journal belongs to another node (...)"), rather than lose or
// repeat anything; running this release again goes on from the directory.
const tombstoneMark = "JOURNAL MOVED: "

func tombstoneNode(nodeID string) string {
	return tombstoneMark + "the journal of " + nodeID + " is now the directory journal/ beside this file, which this release cannot read; " +
		"start the release that moved it (or a later one) again, and do not reset"
}

// isTombstone reports whether the bbolt file at path is a tombstone.
func isTombstone(path string) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, ReadOnly: true})
	if err != nil {
		return false
	}
	defer db.Close()
	db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bMeta); m != nil {
			ok = strings.HasPrefix(string(m.Get(kNodeID)), tombstoneMark)
		}
		return nil
	})
	return ok
}

// retireLegacy puts a tombstone in the place of the imported journal.db,
// keeping the file itself as journal.db.imported-UNIX (a hard link made
// first, then the tombstone renamed over journal.db: there is a
// journal.db at every moment). legacy is no tombstone (legacyLive). It
// returns where the imported file went.
func retireLegacy(legacy, nodeID string) (string, error) {
	aside := fmt.Sprintf("%s.imported-%d", legacy, time.Now().Unix())
	if err := os.Link(legacy, aside); err != nil {
		return "", fmt.Errorf("keeping the imported %s as %s: %w", legacy, aside, err)
	}
	tomb := legacy + ".tombstone"
	_ = os.Remove(tomb)
	db, err := bolt.Open(tomb, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return "", fmt.Errorf("tombstone %s: %w", tomb, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		m, err := tx.CreateBucketIfNotExists(bMeta)
		if err != nil {
			return err
		}
		return m.Put(kNodeID, []byte(tombstoneNode(nodeID)))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tomb, legacy)
	}
	if err != nil {
		os.Remove(tomb)
		return "", fmt.Errorf("tombstone %s: %w", legacy, err)
	}
	return aside, wal.SyncDir(filepath.Dir(legacy))
}
