package adminapi

import (
	"crypto"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"

	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/quorum"
)

// BatchFile is a batch as bcgw batch create prints it, bcgw batch approve
// adds approvals to and bcgw batch submit sends.
type BatchFile struct {
	// Header is the batch header's JSON (base64 in the file): exactly the
	// bytes approvers sign.
	Header []byte `json:"header"`
	// HeaderView is Header decoded, for people; it must say what Header
	// says.
	HeaderView BatchHeaderView `json:"header_view"`
	// Commands are the batch's prepared commands (bcgw run --prepare,
	// signed or not), leaf i being command i.
	Commands []PreparedCommand `json:"commands"`
	// Proofs are each command's Merkle proof under the header's root (an
	// empty step: no sibling at that level).
	Proofs [][][]byte `json:"proofs"`
	// Approvals are quorum.Approve signatures of Header (key id and
	// ES256 signature each).
	Approvals [][]byte `json:"approvals"`
}

// BatchHeaderView is a batch header as people read it: quorum.Header's
// fields, and when the batch expires in RFC 3339.
type BatchHeaderView struct {
	V              int       `json:"v"`
	BatchID        string    `json:"batch_id"`
	Root           []byte    `json:"root"`
	Count          int       `json:"count"`
	NotAfterUnixMS int64     `json:"not_after_unix_ms"`
	NotAfter       time.Time `json:"not_after"`
}

func viewHeader(h quorum.Header) BatchHeaderView {
	return BatchHeaderView{V: h.V, BatchID: h.BatchID, Root: h.Root, Count: h.Count, NotAfterUnixMS: h.NotAfterUnixMS,
		NotAfter: time.UnixMilli(h.NotAfterUnixMS).UTC()}
}

func (v BatchHeaderView) equal(o BatchHeaderView) bool {
	return v.V == o.V && v.BatchID == o.BatchID && string(v.Root) == string(o.Root) && v.Count == o.Count &&
		v.NotAfterUnixMS == o.NotAfterUnixMS && v.NotAfter.Equal(o.NotAfter)
}

// MaxBatchFile bounds a batch file.
const MaxBatchFile = 16 << 20

var batchIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// BuildBatch makes batch id of cmds (leaf i is command i), expiring at
// notAfter, with no approvals. It refuses malformed commands, an id twice,
// a command whose deadline passed at now and an expiry not after now.
func BuildBatch(id string, cmds []PreparedCommand, notAfter, now time.Time) (BatchFile, error) {
	if !batchIDPattern.MatchString(id) {
		return BatchFile{}, fmt.Errorf("batch id %q: 1 to 128 of A-Z a-z 0-9 . _ : - (not starting with a punctuation mark)", TruncateString(id, 140))
	}
	if len(cmds) == 0 {
		return BatchFile{}, errors.New("a batch of no commands")
	}
	if len(cmds) > quorum.MaxLeaves {
		return BatchFile{}, fmt.Errorf("%d commands; a batch has at most %d", len(cmds), quorum.MaxLeaves)
	}
	if !notAfter.After(now) {
		return BatchFile{}, fmt.Errorf("the batch would expire at %s, which is not after now", notAfter.UTC().Format(time.RFC3339))
	}
	out := make([]PreparedCommand, len(cmds))
	leaves := make([]quorum.Leaf, len(cmds))
	seen := map[string]int{}
	for i, c := range cmds {
		f, err := c.Frame()
		if err != nil {
			return BatchFile{}, fmt.Errorf("command %d: %w", i, err)
		}
		if j, dup := seen[f.GetId()]; dup {
			return BatchFile{}, fmt.Errorf("command %d is command %d (%s) again; prepare each command once", i, j, f.GetId())
		}
		seen[f.GetId()] = i
		if dl := time.UnixMilli(f.GetDeadlineUnixMs()); !dl.After(now) {
			return BatchFile{}, fmt.Errorf("command %d (%s): its deadline %s has passed; prepare it again (with a longer --deadline)", i, f.GetId(), dl.UTC().Format(time.RFC3339))
		}
		c.Body = f.GetBody() // the compact form the leaf hashes
		out[i], leaves[i] = c, quorum.LeafOf(f)
	}
	h, proofs, err := quorum.Build(id, leaves, notAfter)
	if err != nil {
		return BatchFile{}, err
	}
	hb, err := quorum.HeaderJSON(h)
	if err != nil {
		return BatchFile{}, err
	}
	for _, p := range proofs {
		for j := range p {
			if p[j] == nil {
				p[j] = []byte{} // "" in JSON, rather than null
			}
		}
	}
	return BatchFile{Header: hb, HeaderView: viewHeader(h), Commands: out, Proofs: proofs, Approvals: [][]byte{}}, nil
}

// Check checks every part of the file and returns its header and its
// commands' frames, each with its BatchLeaf (approvals included): each
// command is the leaf at its index under the header's root, as an agent
// checks it.
func (bf BatchFile) Check() (quorum.Header, []*bcdv1.Command, error) {
	h, err := quorum.DecodeHeader(bf.Header)
	if err != nil {
		return h, nil, err
	}
	if !bf.HeaderView.equal(viewHeader(h)) {
		return h, nil, errors.New("header_view does not say what header says (approvers sign header; header_view is only its reading): create the batch again")
	}
	if len(bf.Commands) != h.Count {
		return h, nil, fmt.Errorf("the header counts %d commands; the file has %d", h.Count, len(bf.Commands))
	}
	if len(bf.Proofs) != h.Count {
		return h, nil, fmt.Errorf("the header counts %d commands; the file has %d proofs", h.Count, len(bf.Proofs))
	}
	if len(bf.Approvals) > quorum.MaxApprovals {
		return h, nil, fmt.Errorf("%d approvals; at most %d", len(bf.Approvals), quorum.MaxApprovals)
	}
	for i, a := range bf.Approvals {
		if len(a) != intent.SignatureSize {
			return h, nil, fmt.Errorf("approval %d is %d bytes; an approval is %d (the approver's key id and an ES256 signature)", i, len(a), intent.SignatureSize)
		}
	}
	frames := make([]*bcdv1.Command, len(bf.Commands))
	seen := map[string]int{}
	for i, c := range bf.Commands {
		f, err := c.Frame()
		if err != nil {
			return h, nil, fmt.Errorf("command %d: %w", i, err)
		}
		if j, dup := seen[f.GetId()]; dup {
			return h, nil, fmt.Errorf("command %d is command %d (%s) again", i, j, f.GetId())
		}
		seen[f.GetId()] = i
		f.Batch = &bcdv1.BatchLeaf{Header: bf.Header, Approvals: bf.Approvals, Index: uint32(i), Proof: bf.Proofs[i]}
		// The agent's own check of the leaf, with no approval asked for
		// (they are counted where the approver set is known) and at the
		// batch's expiry (a file may be read after it).
		if _, err := quorum.Verify(f, quorum.Set{}, time.UnixMilli(h.NotAfterUnixMS)); err != nil {
			return h, nil, fmt.Errorf("command %d (%s: %s for %s) is not leaf %d of batch %s: its kind, node or body differ from what the header's root covers, or its proof is not its own (a batch file is edited only by bcgw batch approve; create it again)",
				i, f.GetId(), f.GetKind(), f.GetNodeId(), i, h.BatchID)
		}
		frames[i] = f
	}
	return h, frames, nil
}

// DecodeBatch reads a batch file strictly and checks it (check).
func DecodeBatch(b []byte) (BatchFile, error) {
	var bf BatchFile
	if len(b) > MaxBatchFile {
		return bf, fmt.Errorf("the batch file is %d bytes; at most %d", len(b), MaxBatchFile)
	}
	if err := StrictDecode(b, &bf); err != nil {
		return bf, fmt.Errorf("not a batch file (bcgw batch create makes one): %w", err)
	}
	if _, _, err := bf.Check(); err != nil {
		return bf, fmt.Errorf("batch file: %w", err)
	}
	if bf.Approvals == nil {
		bf.Approvals = [][]byte{}
	}
	return bf, nil
}

// Expired reports whether the batch expired at now.
func (bf BatchFile) Expired(now time.Time) bool {
	return now.UnixMilli() > bf.HeaderView.NotAfterUnixMS
}

// Describe says what the batch approves, for an approver to read: its id,
// count and expiry, then each leaf's index, kind, node, command id and
// body (cut at 120 bytes).
func (bf BatchFile) Describe(now time.Time) string {
	h := bf.HeaderView
	var b strings.Builder
	exp := h.NotAfter.UTC().Format(time.RFC3339)
	if bf.Expired(now) {
		exp += " (expired)"
	} else {
		exp += fmt.Sprintf(" (in %s)", h.NotAfter.Sub(now).Round(time.Second))
	}
	fmt.Fprintf(&b, "batch %s: %d commands, expires %s, %d approvals so far\n", h.BatchID, h.Count, exp, len(bf.Approvals))
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  LEAF\tKIND\tNODE\tCOMMAND\tBODY")
	for i, c := range bf.Commands {
		body := "-"
		if len(c.Body) > 0 {
			f, _ := c.Frame()
			body = TruncateString(string(f.GetBody()), 120)
		}
		kind := c.Kind
		if !quorum.IsDestructive(kind) {
			kind += " (not destructive)"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\n", i, kind, c.NodeID, c.ID, body)
	}
	tw.Flush()
	return b.String()
}

// ApproveBatch adds key's approval (quorum.Approve over the header) to the
// batch file b and returns it. An approval by the same key already there
// is replaced; an expired batch is refused.
func ApproveBatch(key crypto.Signer, b []byte, now time.Time) (BatchFile, error) {
	bf, err := DecodeBatch(b)
	if err != nil {
		return bf, err
	}
	if bf.Expired(now) {
		return bf, fmt.Errorf("batch %s expired at %s: nothing to approve; create it again", bf.HeaderView.BatchID, bf.HeaderView.NotAfter.UTC().Format(time.RFC3339))
	}
	a, err := quorum.Approve(key, bf.Header)
	if err != nil {
		return bf, err
	}
	id, _, _ := intent.ParseSignature(a)
	kept := bf.Approvals[:0:0]
	for _, o := range bf.Approvals {
		if oid, _, _ := intent.ParseSignature(o); oid != id {
			kept = append(kept, o)
		}
	}
	if len(kept) >= quorum.MaxApprovals {
		return bf, fmt.Errorf("the batch carries %d approvals already, the most it may", quorum.MaxApprovals)
	}
	bf.Approvals = append(kept, a)
	return bf, nil
}

// BatchSubmitView answers a submitted batch: each command's view, in the
// batch's order.
type BatchSubmitView struct {
	BatchID  string        `json:"batch_id"`
	Commands []CommandView `json:"commands"`
	// Warning is about the whole batch (the trust bundle names no
	// approver set); each command's view has its own.
	Warning string `json:"warning,omitempty"`
}
