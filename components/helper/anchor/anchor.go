// Package anchor is what root holds to trust signed intent on its own:
// the join record bcd join (run as root) leaves in root's directory, the
// newest trust bundle signed by the join-signing key root pins, and, per
// section, the generation and digest of the last signed spec root
// applied. bcd helper admits a content-bearing operation (access.apply
// today; host.unit and instance definitions later) only through Admit:
// the section's bytes must be the ones a command-signing root signed, for
// this node, no older than what root applied last (docs/helper.md,
// "Signed sections").
package anchor

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// DefaultDir is root's directory for these files ([helper] state_dir).
const DefaultDir = "/var/lib/bcd-helper"

// Files under the directory.
const (
	RecordFile  = "join-record.json"
	BundleFile  = "trust-bundle.json"
	AppliedFile = "applied.json"
	// TOFUFile names the node a helper without a join record bound to
	// at its first signed section (trust on first use).
	TOFUFile = "tofu-node.json"
)

// NoRootsFix is the line a refusal without command-signing roots ends with.
const NoRootsFix = "root holds no command-signing roots: give the gateway's trust bundle roots (bcgw trust) so the node forwards it, or pin them in root's config.toml ([helper] command_root_sha256)"

// WriteRecord stores rec in dir (created 0700), fsynced. bcd join runs it
// as root after it verified the JoinResponse. A record for another node
// than the one held (or a first record) starts root's bookkeeping anew:
// the generations applied were another node's, and a first-use binding
// gives way to the record; a record signed by another join-signing key
// than the held trust bundle's drops that bundle too.
func WriteRecord(dir string, rec rootsig.JoinRecord) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("join record: %w", err)
	}
	stale := []string{}
	if old, err := readRecord(dir); err != nil || old.NodeID != rec.NodeID {
		stale = append(stale, AppliedFile, TOFUFile)
	}
	// A held trust bundle signed by another join-signing key than the
	// record's is another fleet's (the machine joined a new gateway): it
	// would no longer verify under the new pin and refuse every signed
	// section, so it goes, with the generations applied under it; the
	// node forwards its new fleet's bundle.
	if b, err := os.ReadFile(filepath.Join(dir, BundleFile)); err == nil {
		var held rootsig.Bundle
		if json.Unmarshal(b, &held) != nil || !bytes.Equal(held.SigningKey, rec.SigningKey) {
			stale = append(stale, BundleFile, AppliedFile)
		}
	}
	for _, f := range stale {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("join record: %w", err)
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, RecordFile), b, 0o600); err != nil {
		return fmt.Errorf("join record: %w", err)
	}
	return nil
}

// Binding says what root binds signed intent to, as bcd doctor shows it.
type Binding struct {
	// State is "ok" (a signed join record for this node), "tofu" (no
	// record: the node of the first signed section is taken), or "fail".
	State  string
	NodeID string
	Detail string
}

// Check reads the join record in dir against pin (join_signing_key_pin)
// and nodeID (the node's identity; "" when unknown).
func Check(dir, pin, nodeID string) Binding {
	rec, err := readRecord(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		b := Binding{State: "tofu", Detail: "no join record in " + dir + " (joined before records existed): bcd helper binds to the node of the first signed section it admits; run bcd join again as root to record one"}
		if t, err := readTOFU(dir); err == nil {
			b.NodeID, b.Detail = t, "no join record in "+dir+"; bound on first use to node "+t+" (run bcd join again as root to record one)"
		}
		return b
	case err != nil:
		return Binding{State: "fail", Detail: err.Error()}
	}
	if err := rootsig.VerifyJoinRecord(rec, pin); err != nil {
		return Binding{State: "fail", NodeID: rec.NodeID, Detail: dir + ": " + err.Error()}
	}
	if nodeID != "" && rec.NodeID != nodeID {
		return Binding{State: "fail", NodeID: rec.NodeID, Detail: fmt.Sprintf("the join record in %s is for node %s, but this node is %s: run bcd join again as root", dir, rec.NodeID, nodeID)}
	}
	return Binding{State: "ok", NodeID: rec.NodeID, Detail: "signed join record for node " + rec.NodeID}
}

func readRecord(dir string) (rootsig.JoinRecord, error) {
	var rec rootsig.JoinRecord
	b, err := os.ReadFile(filepath.Join(dir, RecordFile))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("join record %s: %w", filepath.Join(dir, RecordFile), err)
	}
	return rec, nil
}

func readTOFU(dir string) (string, error) {
	var t struct {
		NodeID string `json:"node_id"`
	}
	b, err := os.ReadFile(filepath.Join(dir, TOFUFile))
	if err != nil {
		return "", err
	}
	if err := json.Unmarshal(b, &t); err != nil || t.NodeID == "" {
		return "", fmt.Errorf("%s: not a node id", filepath.Join(dir, TOFUFile))
	}
	return t.NodeID, nil
}

// diskMu serializes what the helper's requests write in the directory:
// each request opens its own Anchors, so a write re-reads the file under
// the lock and changes only its own part (two operations on different
// sections must not lose each other's applied generation, and a bundle
// never goes back to an older one).
var diskMu sync.Mutex

// applied is what root applied of one section.
type applied struct {
	Generation uint64 `json:"generation"`
	Digest     []byte `json:"digest,omitempty"`
}

// Anchors are root's trust anchors. Safe for concurrent use.
type Anchors struct {
	dir, pin string
	// pinned are [helper] command_root_sha256: when set, the only roots.
	pinned map[[32]byte]bool

	mu      sync.Mutex
	broken  error  // a record that does not verify: every Admit fails
	nodeID  string // from the record, or bound on first use
	tofu    bool
	bundle  rootsig.BundleDoc
	held    []byte // the held bundle's document
	applied map[string]applied
}

// Open loads the anchors from dir. pin is root's join_signing_key_pin;
// commandRoots are [helper] command_root_sha256 (hex SHA-256 of each
// root's SPKI). A record or held bundle that no longer verifies leaves
// the anchors broken (every Admit refused, saying why), not absent.
func Open(dir, pin string, commandRoots []string) (*Anchors, error) {
	a := &Anchors{dir: dir, pin: pin, applied: map[string]applied{}}
	for _, h := range commandRoots {
		b, err := hex.DecodeString(strings.TrimSpace(h))
		if err != nil || len(b) != 32 {
			return nil, fmt.Errorf("helper.command_root_sha256: %q is not a hex SHA-256", h)
		}
		if a.pinned == nil {
			a.pinned = map[[32]byte]bool{}
		}
		a.pinned[[32]byte(b)] = true
	}
	rec, err := readRecord(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		a.tofu = true
		if t, err := readTOFU(dir); err == nil {
			a.nodeID = t
		}
	case err != nil:
		a.broken = err
	default:
		if err := rootsig.VerifyJoinRecord(rec, pin); err != nil {
			a.broken = fmt.Errorf("%s: %w (run bcd join again as root)", filepath.Join(dir, RecordFile), err)
		}
		a.nodeID = rec.NodeID
	}
	if b, err := os.ReadFile(filepath.Join(dir, BundleFile)); err == nil {
		var tb rootsig.Bundle
		err := json.Unmarshal(b, &tb)
		if err == nil {
			var doc rootsig.BundleDoc
			if doc, err = rootsig.VerifyBundle(tb, pin); err == nil {
				a.bundle, a.held = doc, tb.Document
			}
		}
		if err != nil && a.broken == nil {
			a.broken = fmt.Errorf("the trust bundle root holds (%s) no longer verifies: %w", filepath.Join(dir, BundleFile), err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, AppliedFile)); err == nil {
		if err := json.Unmarshal(b, &a.applied); err != nil && a.broken == nil {
			a.broken = fmt.Errorf("%s: %w", filepath.Join(dir, AppliedFile), err)
		}
	}
	return a, nil
}

// NodeID is the node root binds to ("" before a first-use binding).
func (a *Anchors) NodeID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nodeID
}

// BundleVersion is the version of the trust bundle root holds (0: none).
func (a *Anchors) BundleVersion() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bundle.Version
}

// offer takes b when it verifies under root's pin and is newer than the
// held bundle, storing it first. An older bundle is ignored; another
// document at the held version, or one that drops every root once root
// holds some, is refused.
func (a *Anchors) offer(b *rootsig.Bundle) error {
	if b == nil || len(b.Document) == 0 {
		return nil
	}
	doc, err := rootsig.VerifyBundle(*b, a.pin)
	if err != nil {
		return err
	}
	// An older bundle than root's is not refused here: root goes on with
	// its own (a node behind root's bundle cannot take it back).
	take, err := rootsig.NextBundle(rootsig.Held{Version: a.bundle.Version, Document: a.held, HasRoots: len(a.bundle.Roots) > 0},
		rootsig.Held{Version: doc.Version, Document: b.Document, HasRoots: len(doc.Roots) > 0})
	if errors.Is(err, rootsig.ErrOlderBundle) || err == nil && !take {
		return nil
	}
	if err != nil {
		return err
	}
	j, err := json.Marshal(b)
	if err != nil {
		return err
	}
	diskMu.Lock()
	defer diskMu.Unlock()
	if cur, err := os.ReadFile(filepath.Join(a.dir, BundleFile)); err == nil {
		var held rootsig.Bundle
		if json.Unmarshal(cur, &held) == nil {
			if d, err := rootsig.VerifyBundle(held, a.pin); err == nil && d.Version >= doc.Version {
				// Another request stored this one, or a newer, meanwhile.
				a.bundle, a.held = d, held.Document
				return nil
			}
		}
	}
	if err := atomicfile.Write(filepath.Join(a.dir, BundleFile), j, 0o600); err != nil {
		return fmt.Errorf("storing the trust bundle: %w", err)
	}
	a.bundle, a.held = doc, bytes.Clone(b.Document)
	return nil
}

// roots are the command-signing roots root accepts: [helper]
// command_root_sha256 when set (the keys themselves from the held bundle
// or the proof's signer), else the held bundle's.
func (a *Anchors) roots(signer []byte) rootsig.Roots {
	if a.pinned == nil {
		return a.bundle.Roots
	}
	r := rootsig.Roots{}
	for id, k := range a.bundle.Roots {
		if a.pinned[id] {
			r[id] = k
		}
	}
	if id := rootsig.KeyID(signer); len(signer) > 0 && a.pinned[id] {
		if pr, err := rootsig.ParseRoots([][]byte{signer}); err == nil {
			r[id] = pr[id]
		}
	}
	return r
}

// Admit checks that body is section name of a spec signed for this node
// by a root root accepts, no older than the last one root applied of
// that section, taking the proof's trust bundle first when it is newer.
// commit records the section applied; call it once the operation
// succeeded.
func (a *Anchors) Admit(p rootsig.Proof, name string, body []byte) (commit func() error, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.broken != nil {
		return nil, a.broken
	}
	if a.nodeID != "" && p.NodeID != a.nodeID {
		return nil, fmt.Errorf("the spec is signed for node %s; root is bound to node %s", p.NodeID, a.nodeID)
	}
	if err := a.offer(p.Bundle); err != nil {
		return nil, err
	}
	roots := a.roots(p.Signer)
	if len(roots) == 0 {
		return nil, errors.New(NoRootsFix)
	}
	if err := roots.VerifySection(p, name, body); err != nil {
		return nil, err
	}
	digest := p.Sections[name]
	if last, ok := a.applied[name]; ok {
		switch {
		case p.Generation < last.Generation:
			return nil, fmt.Errorf("the spec is generation %d; root applied generation %d of the %s section: an older spec is refused", p.Generation, last.Generation, name)
		case p.Generation == last.Generation && !bytes.Equal(digest, last.Digest):
			return nil, fmt.Errorf("generation %d's %s section differs from the one root applied at that generation", p.Generation, name)
		}
	}
	bind := a.nodeID == ""
	return func() error {
		a.mu.Lock()
		defer a.mu.Unlock()
		diskMu.Lock()
		defer diskMu.Unlock()
		if bind && a.nodeID == "" {
			if t, err := readTOFU(a.dir); err == nil && t != p.NodeID {
				return fmt.Errorf("root was bound to node %s meanwhile; the spec is for node %s", t, p.NodeID)
			}
			b, _ := json.Marshal(map[string]string{"node_id": p.NodeID})
			if err := atomicfile.Write(filepath.Join(a.dir, TOFUFile), b, 0o600); err != nil {
				return fmt.Errorf("recording the node bound on first use: %w", err)
			}
			a.nodeID = p.NodeID
		}
		// What is on disk now: another request may have recorded its
		// section since this one opened the anchors.
		next := map[string]applied{}
		if b, err := os.ReadFile(filepath.Join(a.dir, AppliedFile)); err == nil {
			if err := json.Unmarshal(b, &next); err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(a.dir, AppliedFile), err)
			}
		}
		if cur, ok := next[name]; !ok || cur.Generation <= p.Generation {
			next[name] = applied{Generation: p.Generation, Digest: digest}
		}
		b, err := json.Marshal(next)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(filepath.Join(a.dir, AppliedFile), b, 0o600); err != nil {
			return fmt.Errorf("recording the applied generation: %w", err)
		}
		a.applied = next
		return nil
	}, nil
}
