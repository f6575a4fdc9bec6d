// Package quorum is the destructive-batch quorum: with approvers in the
// trust bundle, a destructive command (Destructive) runs only as a leaf of
// a batch whose header at least threshold approvers signed, and each leaf
// runs at most once.
//
// A batch is a list of leaves, each binding a kind, a node id and the
// SHA-256 of a command body. Its header names the batch, the Merkle root
// of the leaves (SHA-256, leaf hashes prefixed 0x00, inner nodes 0x01, an
// odd node carried up unchanged), their count and when the batch expires;
// approvers sign the header's JSON for the purpose "bcd/batch/v1". A
// command carries its BatchLeaf (the header, the approvals, its index and
// Merkle proof); the agent rebuilds the leaf from the command itself, so a
// leaf approved for one node, kind or body is worth nothing for another.
//
// An approver set changes only at a higher epoch, endorsed by at least the
// held set's threshold of its keys (purpose "bcd/approver-set/v1").
// docs/signed-intent.md describes the rules.
package quorum

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/better-compute/bcd/components/trust/intent"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Signature purposes.
const (
	PurposeBatch       = "bcd/batch/v1"
	PurposeApproverSet = "bcd/approver-set/v1"
)

// Bounds.
const (
	MaxLeaves    = 100000
	MaxProof     = 20 // ceil(log2(MaxLeaves)) + a margin
	MaxHeader    = 4 << 10
	MaxApprovals = 16
)

// Destructive are the kinds that need a batch once the bundle names
// approvers: they destroy data, change what a machine boots, or cut its
// power or its BMC's credentials.
var Destructive = []string{
	"disk.wipe", "deploy.image", "boot.kexec", "node.reboot", "gpu.reset",
	"bmc.power", "bmc.rotateCredentials", "bmc.bios",
}

// IsDestructive reports whether kind needs a batch.
func IsDestructive(kind string) bool { return slices.Contains(Destructive, kind) }

// ErrUnapproved is the refusal of a destructive command without a valid
// batch leaf (BATCH_UNAPPROVED).
var ErrUnapproved = errors.New("BATCH_UNAPPROVED")

// Leaf is what one batch leaf approves.
type Leaf struct {
	Kind       string `json:"kind"`
	NodeID     string `json:"node_id"`
	BodySHA256 []byte `json:"body_sha256"`
}

// LeafOf is the leaf a command is.
func LeafOf(c *bcdv1.Command) Leaf {
	sum := sha256.Sum256(c.GetBody())
	return Leaf{Kind: c.GetKind(), NodeID: c.GetNodeId(), BodySHA256: sum[:]}
}

// Hash is the leaf's Merkle hash.
func (l Leaf) Hash() [32]byte {
	b, _ := json.Marshal(l)
	return sha256.Sum256(append([]byte{0}, b...))
}

func inner(a, b [32]byte) [32]byte {
	return sha256.Sum256(append(append([]byte{1}, a[:]...), b[:]...))
}

// Header is a batch's signed header.
type Header struct {
	V              int    `json:"v"`
	BatchID        string `json:"batch_id"`
	Root           []byte `json:"root"`
	Count          int    `json:"count"`
	NotAfterUnixMS int64  `json:"not_after_unix_ms"`
}

// Build makes a batch of leaves: its header (to approve) and each leaf's
// Merkle proof.
func Build(batchID string, leaves []Leaf, notAfter time.Time) (Header, [][][]byte, error) {
	if batchID == "" || len(batchID) > 128 {
		return Header{}, nil, errors.New("a batch id of 1 to 128 bytes")
	}
	if len(leaves) == 0 || len(leaves) > MaxLeaves {
		return Header{}, nil, fmt.Errorf("%d leaves; 1 to %d", len(leaves), MaxLeaves)
	}
	level := make([][32]byte, len(leaves))
	for i, l := range leaves {
		level[i] = l.Hash()
	}
	pos := make([]int, len(leaves))
	for i := range pos {
		pos[i] = i
	}
	proofs := make([][][]byte, len(leaves))
	for len(level) > 1 {
		var next [][32]byte
		for i := 0; i < len(level); i += 2 {
			if i+1 < len(level) {
				next = append(next, inner(level[i], level[i+1]))
			} else {
				next = append(next, level[i])
			}
		}
		for leaf, p := range pos {
			sib := p ^ 1
			if sib < len(level) {
				h := level[sib]
				proofs[leaf] = append(proofs[leaf], h[:])
			} else {
				proofs[leaf] = append(proofs[leaf], nil) // carried up
			}
			pos[leaf] = p / 2
		}
		level = next
	}
	root := level[0]
	return Header{V: 1, BatchID: batchID, Root: root[:], Count: len(leaves), NotAfterUnixMS: notAfter.UnixMilli()}, proofs, nil
}

// rootFrom walks a leaf hash up its proof.
func rootFrom(h [32]byte, index, count int, proof [][]byte) ([32]byte, error) {
	if len(proof) > MaxProof {
		return h, fmt.Errorf("proof of %d steps; at most %d", len(proof), MaxProof)
	}
	width := count
	for _, step := range proof {
		switch {
		case len(step) == 0:
			if index^1 < width {
				return h, errors.New("proof skips a sibling that exists")
			}
		case len(step) != 32:
			return h, errors.New("proof step is not 32 bytes")
		case index%2 == 0:
			if index+1 >= width {
				return h, errors.New("proof names a sibling that does not exist")
			}
			h = inner(h, [32]byte(step))
		default:
			h = inner([32]byte(step), h)
		}
		index /= 2
		width = (width + 1) / 2
	}
	if width != 1 {
		return h, errors.New("proof is too short for the batch")
	}
	return h, nil
}

// DecodeHeader reads a header strictly.
func DecodeHeader(b []byte) (Header, error) {
	var h Header
	if len(b) > MaxHeader {
		return h, fmt.Errorf("batch header is %d bytes; at most %d", len(b), MaxHeader)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return h, fmt.Errorf("batch header: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return h, errors.New("batch header: data after the JSON object")
	}
	if h.V != 1 || h.BatchID == "" || len(h.BatchID) > 128 || len(h.Root) != 32 || h.Count < 1 || h.Count > MaxLeaves || h.NotAfterUnixMS == 0 {
		return h, errors.New("batch header: v 1, a batch id, a 32-byte root, a count and not_after_unix_ms are required")
	}
	return h, nil
}

// Approve signs a header for an approver.
func Approve(k crypto.Signer, header []byte) ([]byte, error) {
	return intent.Sign(k, PurposeBatch, header)
}

// Set is an approver set: threshold of keys must sign.
type Set struct {
	Epoch     uint64
	Threshold int
	Keys      *intent.Roots
}

// countSigners returns how many distinct keys of keys made a valid
// signature for purpose over msg among sigs.
func countSigners(keys *intent.Roots, purpose string, msg []byte, sigs [][]byte) int {
	seen := map[[32]byte]bool{}
	for _, s := range sigs {
		id, sig, err := intent.ParseSignature(s)
		if err != nil || seen[id] {
			continue
		}
		if keys.Verify(id, purpose, msg, sig) == nil {
			seen[id] = true
		}
	}
	return len(seen)
}

// Verified is a leaf that passed Verify: its spend key for the ledger.
type Verified struct {
	BatchID  string
	Index    int
	NotAfter time.Time
}

// Key is the ledger key of a verified leaf.
func (v Verified) Key() string { return fmt.Sprintf("%s/%d", v.BatchID, v.Index) }

// Verify checks that c is a leaf of an unexpired batch approved by set at
// now; it does not spend the leaf (Ledger does).
func Verify(c *bcdv1.Command, set Set, now time.Time) (Verified, error) {
	b := c.GetBatch()
	if b == nil {
		return Verified{}, fmt.Errorf("%w: %s is destructive and carries no approved batch leaf", ErrUnapproved, c.GetKind())
	}
	h, err := DecodeHeader(b.GetHeader())
	if err != nil {
		return Verified{}, fmt.Errorf("%w: %v", ErrUnapproved, err)
	}
	if now.UnixMilli() > h.NotAfterUnixMS {
		return Verified{}, fmt.Errorf("%w: batch %s expired at %s", ErrUnapproved, h.BatchID, time.UnixMilli(h.NotAfterUnixMS).UTC().Format(time.RFC3339))
	}
	idx := int(b.GetIndex())
	if idx >= h.Count {
		return Verified{}, fmt.Errorf("%w: leaf %d of a batch of %d", ErrUnapproved, idx, h.Count)
	}
	root, err := rootFrom(LeafOf(c).Hash(), idx, h.Count, b.GetProof())
	if err != nil || !bytes.Equal(root[:], h.Root) {
		return Verified{}, fmt.Errorf("%w: the command is not leaf %d of batch %s (its kind, node or body differ from what was approved)", ErrUnapproved, idx, h.BatchID)
	}
	if len(b.GetApprovals()) > MaxApprovals {
		return Verified{}, fmt.Errorf("%w: %d approvals; at most %d", ErrUnapproved, len(b.GetApprovals()), MaxApprovals)
	}
	if n := countSigners(set.Keys, PurposeBatch, b.GetHeader(), b.GetApprovals()); n < set.Threshold {
		return Verified{}, fmt.Errorf("%w: batch %s has %d valid approvals of the approver set (epoch %d); it needs %d", ErrUnapproved, h.BatchID, n, set.Epoch, set.Threshold)
	}
	return Verified{BatchID: h.BatchID, Index: idx, NotAfter: time.UnixMilli(h.NotAfterUnixMS)}, nil
}

// setMessage is what an endorsement of an approver set covers.
type setMessage struct {
	V         int      `json:"v"`
	Epoch     uint64   `json:"epoch"`
	Threshold int      `json:"threshold"`
	Keys      [][]byte `json:"keys"`
}

// SetMessage returns the bytes an endorsement of a set covers.
func SetMessage(epoch uint64, threshold int, keys [][]byte) []byte {
	b, _ := json.Marshal(setMessage{V: 1, Epoch: epoch, Threshold: threshold, Keys: keys})
	return b
}

// Endorse signs a proposed set with an approver key of the held set.
func Endorse(k crypto.Signer, epoch uint64, threshold int, keys [][]byte) ([]byte, error) {
	return intent.Sign(k, PurposeApproverSet, SetMessage(epoch, threshold, keys))
}

// Endorsed reports why a proposed set (epoch, threshold, keys,
// endorsements) may not replace held: nil when it may (a higher epoch,
// endorsed by at least held's threshold of held's keys).
func Endorsed(held Set, epoch uint64, threshold int, keys [][]byte, endorsements [][]byte) error {
	if epoch <= held.Epoch {
		return fmt.Errorf("approver set epoch %d is not above the held epoch %d", epoch, held.Epoch)
	}
	if n := countSigners(held.Keys, PurposeApproverSet, SetMessage(epoch, threshold, keys), endorsements); n < held.Threshold {
		return fmt.Errorf("approver set epoch %d is endorsed by %d of the held set's keys; it needs %d", epoch, n, held.Threshold)
	}
	return nil
}

// HeaderJSON is the header's JSON, the bytes approvers sign.
func HeaderJSON(h Header) ([]byte, error) { return json.Marshal(h) }
