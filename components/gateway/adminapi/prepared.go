package adminapi

import (
	"bytes"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/trust/intent"
)

// PreparedCommand is a command as bcgw run --prepare prints it, bcgw sign
// signs it and bcgw run --submit sends it.
type PreparedCommand struct {
	ID         string          `json:"id"`
	NodeID     string          `json:"node_id"`
	Kind       string          `json:"kind"`
	Lane       string          `json:"lane"`
	WorkflowID string          `json:"workflow_id"`
	DeadlineMS int64           `json:"deadline_unix_ms"`
	Body       json.RawMessage `json:"body,omitempty"`
	// Signature is the Command.signature (key id and ES256 signature,
	// components/trust/intent), base64 in JSON.
	Signature []byte `json:"signature,omitempty"`
}

// PreparedSpec is a desired spec change as bcgw spec prepare prints it,
// bcgw sign signs it and bcgw spec submit sends it: the DesiredState the
// node gets, for generation Generation. A full spec has no
// base_generation; a patch applies on BaseGeneration, Generation-1.
type PreparedSpec struct {
	Node           string          `json:"node"`
	Generation     uint64          `json:"generation"`
	Patch          bool            `json:"patch"`
	BaseGeneration uint64          `json:"base_generation"`
	Spec           json.RawMessage `json:"spec"`
	// Full is the full spec a patch makes (for a full spec, the spec
	// itself: omitted). The signature covers the digest of each of its
	// sections, so that bcd helper can check a section on its own
	// (components/trust/rootsig).
	Full      json.RawMessage `json:"full,omitempty"`
	Signature []byte          `json:"signature,omitempty"`
}

// FullSpec is the full spec p makes, decoded.
func (p PreparedSpec) FullSpec() (nodespec.Spec, error) {
	b := p.Spec
	if p.Patch {
		b = p.Full
	}
	full, err := nodespec.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("the full spec of prepared generation %d: %w", p.Generation, err)
	}
	return full, nil
}

var (
	commandIDPattern  = regexp.MustCompile(`^cmd_[a-z2-7]{21}$`)
	kindPattern       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	lanePattern       = regexp.MustCompile(`^[a-z]{0,32}$`)
	workflowIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:/-]{0,128}$`)
)

// CompactJSON is the compact encoding of a JSON value, nil for none.
func CompactJSON(b json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	var c bytes.Buffer
	if err := json.Compact(&c, b); err != nil {
		return nil, err
	}
	return c.Bytes(), nil
}

func checkSignatureField(sig []byte) error {
	if len(sig) != 0 && len(sig) != intent.SignatureSize {
		return fmt.Errorf("signature is %d bytes; a signature is %d (the signer's key id and an ES256 signature)", len(sig), intent.SignatureSize)
	}
	return nil
}

// Frame checks every field and returns the Command it stands for,
// signature included.
func (p PreparedCommand) Frame() (*bcdv1.Command, error) {
	switch {
	case !commandIDPattern.MatchString(p.ID):
		return nil, fmt.Errorf("id %q is not a command id (cmd_ and 21 of a-z2-7, as bcgw run --prepare makes it)", TruncateString(p.ID, 64))
	case !NodeIDPattern.MatchString(p.NodeID):
		return nil, fmt.Errorf("node_id %q is not a node id", TruncateString(p.NodeID, 64))
	case !kindPattern.MatchString(p.Kind):
		return nil, fmt.Errorf("kind %q is not a command kind", TruncateString(p.Kind, 64))
	case !lanePattern.MatchString(p.Lane):
		return nil, fmt.Errorf("lane %q is not a lane (a-z, or empty)", TruncateString(p.Lane, 64))
	case !workflowIDPattern.MatchString(p.WorkflowID):
		return nil, fmt.Errorf("workflow_id %q is not a workflow id", TruncateString(p.WorkflowID, 64))
	case p.DeadlineMS <= 0:
		return nil, errors.New("deadline_unix_ms is missing")
	}
	body, err := CompactJSON(p.Body)
	if err != nil {
		return nil, fmt.Errorf("body is not JSON: %w", err)
	}
	if len(body) > 1<<20 {
		return nil, errors.New("body is larger than 1 MiB")
	}
	if err := checkSignatureField(p.Signature); err != nil {
		return nil, err
	}
	return &bcdv1.Command{Id: p.ID, NodeId: p.NodeID, Kind: p.Kind, Lane: p.Lane, WorkflowId: p.WorkflowID,
		DeadlineUnixMs: p.DeadlineMS, Body: body, Signature: p.Signature}, nil
}

// Frame checks every field and returns the DesiredState it stands for,
// signature included.
func (p PreparedSpec) Frame() (*bcdv1.DesiredState, error) {
	switch {
	case !NodeIDPattern.MatchString(p.Node):
		return nil, fmt.Errorf("node %q is not a node id", TruncateString(p.Node, 64))
	case p.Generation == 0:
		return nil, errors.New("generation is missing")
	case p.Patch && p.BaseGeneration != p.Generation-1:
		return nil, fmt.Errorf("a patch for generation %d applies on generation %d, not %d", p.Generation, p.Generation-1, p.BaseGeneration)
	case !p.Patch && p.BaseGeneration != 0:
		return nil, errors.New("a full spec has no base_generation (0)")
	}
	spec, err := CompactJSON(p.Spec)
	if err != nil || len(spec) == 0 || spec[0] != '{' {
		return nil, errors.New("spec is not a JSON object")
	}
	if len(spec) > nodespec.MaxBytes {
		return nil, fmt.Errorf("spec is %d bytes; at most %d (4 MiB)", len(spec), nodespec.MaxBytes)
	}
	if err := checkSignatureField(p.Signature); err != nil {
		return nil, err
	}
	return &bcdv1.DesiredState{Generation: p.Generation, Patch: p.Patch, BaseGeneration: p.BaseGeneration, Spec: spec, Signature: p.Signature}, nil
}

// MaxPrepared bounds a prepared file: a spec of 4 MiB, indented.
const MaxPrepared = 3 * nodespec.MaxBytes

func StrictDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}

// DecodePrepared reads a prepared command or spec strictly: a command
// has a "kind", a spec a "spec". Exactly one of the two is returned.
func DecodePrepared(b []byte) (*PreparedCommand, *PreparedSpec, error) {
	if len(b) > MaxPrepared {
		return nil, nil, fmt.Errorf("the prepared file is %d bytes; at most %d", len(b), MaxPrepared)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return nil, nil, fmt.Errorf("not a prepared command or spec (a JSON object): %w", err)
	}
	_, isCmd := keys["kind"]
	_, isSpec := keys["spec"]
	switch {
	case isCmd && !isSpec:
		var c PreparedCommand
		if err := StrictDecode(b, &c); err != nil {
			return nil, nil, fmt.Errorf("prepared command: %w", err)
		}
		if _, err := c.Frame(); err != nil {
			return nil, nil, fmt.Errorf("prepared command: %w", err)
		}
		return &c, nil, nil
	case isSpec && !isCmd:
		var sp PreparedSpec
		if err := StrictDecode(b, &sp); err != nil {
			return nil, nil, fmt.Errorf("prepared spec: %w", err)
		}
		if _, err := sp.Frame(); err != nil {
			return nil, nil, fmt.Errorf("prepared spec: %w", err)
		}
		return nil, &sp, nil
	default:
		return nil, nil, errors.New("not a prepared command (bcgw run --prepare) or spec (bcgw spec prepare)")
	}
}

// SignPrepared signs a prepared command or spec (the JSON of bcgw run
// --prepare or bcgw spec prepare) with key and returns it with its
// signature, and a line saying what was signed. A signature already there
// is replaced.
func SignPrepared(key crypto.Signer, b []byte) (any, string, error) {
	c, sp, err := DecodePrepared(b)
	if err != nil {
		return nil, "", err
	}
	if c != nil {
		f, _ := c.Frame()
		f.Signature = nil
		sig, err := intent.SignCommand(key, f)
		if err != nil {
			return nil, "", err
		}
		c.Body, c.Signature = f.GetBody(), sig
		what := fmt.Sprintf("command %s: %s for %s, deadline %s", c.ID, c.Kind, c.NodeID,
			time.UnixMilli(c.DeadlineMS).UTC().Format(time.RFC3339))
		return c, what, nil
	}
	f, _ := sp.Frame()
	f.Signature = nil
	full, err := sp.FullSpec()
	if err != nil {
		return nil, "", err
	}
	sig, err := intent.SignDesiredState(key, sp.Node, f, full)
	if err != nil {
		return nil, "", err
	}
	sp.Spec, sp.Signature = f.GetSpec(), sig
	what := fmt.Sprintf("spec generation %d of %s", sp.Generation, sp.Node)
	if sp.Patch {
		what = fmt.Sprintf("spec patch for generation %d of %s (onto %d)", sp.Generation, sp.Node, sp.BaseGeneration)
	}
	return sp, what, nil
}

// SubmitCommandRequest is a prepared command to send, with deploy.image's
// user data (a secret bound to the command, not part of what is signed).
type SubmitCommandRequest struct {
	Command       PreparedCommand   `json:"command"`
	UserData      []byte            `json:"user_data,omitempty"`
	SecretHeaders map[string]string `json:"secret_headers,omitempty"`
}

// ErrPreparedStale refuses a prepared spec whose node's generation moved.
var ErrPreparedStale = errors.New("prepare it again")

// SubmitView answers a submitted spec.
type SubmitView struct {
	Generation uint64 `json:"generation"`
	Warning    string `json:"warning,omitempty"`
}

// NodeIDPattern is what a node id named by an operator may look like: it
// goes into a SPIFFE id and file names.
var NodeIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
