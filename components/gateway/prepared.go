package gateway

import (
	"bytes"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"time"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/intent"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// External signing: a command or a spec change is prepared by the gateway
// (bcgw run --prepare, bcgw spec prepare), signed where the key lives
// (bcgw sign, no gateway needed) and submitted as it is (bcgw run
// --submit, bcgw spec submit). The prepared JSON is the signed frame's
// fields; a JSON body or spec stands for its compact encoding
// (json.Compact), so a file may be re-indented between the steps, but
// not otherwise changed.

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
	Signature      []byte          `json:"signature,omitempty"`
}

var (
	commandIDPattern  = regexp.MustCompile(`^cmd_[a-z2-7]{21}$`)
	kindPattern       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	lanePattern       = regexp.MustCompile(`^[a-z]{0,32}$`)
	workflowIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:/-]{0,128}$`)
)

// compactJSON is the compact encoding of a JSON value, nil for none.
func compactJSON(b json.RawMessage) ([]byte, error) {
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
		return nil, fmt.Errorf("id %q is not a command id (cmd_ and 21 of a-z2-7, as bcgw run --prepare makes it)", truncateString(p.ID, 64))
	case !nodeIDPattern.MatchString(p.NodeID):
		return nil, fmt.Errorf("node_id %q is not a node id", truncateString(p.NodeID, 64))
	case !kindPattern.MatchString(p.Kind):
		return nil, fmt.Errorf("kind %q is not a command kind", truncateString(p.Kind, 64))
	case !lanePattern.MatchString(p.Lane):
		return nil, fmt.Errorf("lane %q is not a lane (a-z, or empty)", truncateString(p.Lane, 64))
	case !workflowIDPattern.MatchString(p.WorkflowID):
		return nil, fmt.Errorf("workflow_id %q is not a workflow id", truncateString(p.WorkflowID, 64))
	case p.DeadlineMS <= 0:
		return nil, errors.New("deadline_unix_ms is missing")
	}
	body, err := compactJSON(p.Body)
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
	case !nodeIDPattern.MatchString(p.Node):
		return nil, fmt.Errorf("node %q is not a node id", truncateString(p.Node, 64))
	case p.Generation == 0:
		return nil, errors.New("generation is missing")
	case p.Patch && p.BaseGeneration != p.Generation-1:
		return nil, fmt.Errorf("a patch for generation %d applies on generation %d, not %d", p.Generation, p.Generation-1, p.BaseGeneration)
	case !p.Patch && p.BaseGeneration != 0:
		return nil, errors.New("a full spec has no base_generation (0)")
	}
	spec, err := compactJSON(p.Spec)
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

// maxPrepared bounds a prepared file: a spec of 4 MiB, indented.
const maxPrepared = 3 * nodespec.MaxBytes

func strictDecode(b []byte, v any) error {
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
	if len(b) > maxPrepared {
		return nil, nil, fmt.Errorf("the prepared file is %d bytes; at most %d", len(b), maxPrepared)
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
		if err := strictDecode(b, &c); err != nil {
			return nil, nil, fmt.Errorf("prepared command: %w", err)
		}
		if _, err := c.Frame(); err != nil {
			return nil, nil, fmt.Errorf("prepared command: %w", err)
		}
		return &c, nil, nil
	case isSpec && !isCmd:
		var sp PreparedSpec
		if err := strictDecode(b, &sp); err != nil {
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
	sig, err := intent.SignDesiredState(key, sp.Node, f)
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

// signatureWarning says why agents that hold the current trust bundle
// would refuse what verify checks ("" when they would take it).
func (s *Server) signatureWarning(verify func(r *intent.Roots) error) string {
	s.trust.mu.Lock()
	v, roots := s.trust.doc.Version, s.trust.doc.Roots()
	s.trust.mu.Unlock()
	if err := verify(roots); err != nil {
		return fmt.Sprintf("agents that hold trust bundle version %d refuse it: %v", v, err)
	}
	return ""
}

// ---- commands ----

// PrepareCommand makes a command for node without storing or sending it:
// a new id, the deadline from now, no signature. The gateway reserves
// nothing; SubmitCommand stores it.
func (s *Server) PrepareCommand(nodeID, kind string, body []byte, deadline time.Duration) (PreparedCommand, error) {
	if deadline <= 0 {
		deadline = 10 * time.Minute
	}
	if n, err := s.store.Node(nodeID); err != nil {
		return PreparedCommand{}, fmt.Errorf("node %s: %w", nodeID, err)
	} else if n.Revoked {
		return PreparedCommand{}, fmt.Errorf("node %s is revoked", nodeID)
	}
	b, err := compactJSON(body)
	if err != nil {
		return PreparedCommand{}, fmt.Errorf("body is not JSON: %w", err)
	}
	p := PreparedCommand{ID: newCommandID(), NodeID: nodeID, Kind: kind, DeadlineMS: s.now().Add(deadline).UnixMilli(), Body: b}
	if _, err := p.Frame(); err != nil {
		return PreparedCommand{}, err
	}
	return p, nil
}

// SubmitCommand stores a prepared command, with the signature it carries
// (none for one submitted unsigned), and sends it; bcgw never signs it.
// It refuses malformed fields, an unknown or revoked node, a passed
// deadline and an id that exists. The warning says when agents holding
// the current trust bundle will refuse it.
func (s *Server) SubmitCommand(p PreparedCommand, secrets map[string][]byte) (store.Command, string, error) {
	f, err := p.Frame()
	if err != nil {
		return store.Command{}, "", err
	}
	if n, err := s.store.Node(f.GetNodeId()); err != nil {
		return store.Command{}, "", fmt.Errorf("node %s: %w", f.GetNodeId(), err)
	} else if n.Revoked {
		return store.Command{}, "", fmt.Errorf("node %s is revoked", f.GetNodeId())
	}
	now := s.now()
	if dl := time.UnixMilli(f.GetDeadlineUnixMs()); !dl.After(now) {
		return store.Command{}, "", fmt.Errorf("the command's deadline %s has passed; prepare it again (with a longer --deadline)", dl.UTC().Format(time.RFC3339))
	}
	if _, err := s.store.Command(f.GetId()); err == nil {
		return store.Command{}, "", fmt.Errorf("command %s exists already (was this file submitted before?)", f.GetId())
	}
	c := store.Command{ID: f.GetId(), NodeID: f.GetNodeId(), Kind: f.GetKind(), Body: f.GetBody(), DeadlineMS: f.GetDeadlineUnixMs(),
		Lane: f.GetLane(), WorkflowID: f.GetWorkflowId(), Signature: f.GetSignature(), CreatedAt: now.UTC()}
	warning := joinWarnings(s.signatureWarning(func(r *intent.Roots) error { return r.VerifyCommand(f) }), s.unbatchedWarning(f.GetKind()))
	for name, v := range secrets {
		if err := s.putCommandSecret(c.ID, name, v); err != nil {
			return c, "", err
		}
	}
	if err := s.store.AddCommand(c); err != nil {
		return c, "", err
	}
	c.State = store.StatePending
	s.noteUpgrade(c)
	s.pushCommand(c)
	s.log.Info("command submitted", "node", c.NodeID, "command_id", c.ID, "kind", c.Kind, "signed", len(c.Signature) > 0, "warning", warning)
	return c, warning, nil
}

// SubmitCommandRequest is a prepared command to send, with deploy.image's
// user data (a secret bound to the command, not part of what is signed).
type SubmitCommandRequest struct {
	Command       PreparedCommand   `json:"command"`
	UserData      []byte            `json:"user_data,omitempty"`
	SecretHeaders map[string]string `json:"secret_headers,omitempty"`
}

func (s *Server) adminPrepareCommand(w http.ResponseWriter, r *http.Request) {
	var req CommandRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	if len(req.UserData) > 0 {
		adminErr(w, http.StatusBadRequest, errors.New("user data is not prepared: give it to bcgw run --submit"))
		return
	}
	p, err := s.PrepareCommand(req.Node, req.Kind, req.Body, time.Duration(req.DeadlineSeconds)*time.Second)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, p)
}

func (s *Server) adminSubmitCommand(w http.ResponseWriter, r *http.Request) {
	var req SubmitCommandRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	secrets, err := commandSecrets(req.Command.Kind, req.UserData, req.SecretHeaders)
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	c, warning, err := s.SubmitCommand(req.Command, secrets)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	v := viewCommand(c)
	v.Warning = warning
	writeJSON(w, v)
}

// ---- specs ----

// PrepareSpec works out the next generation of a node's desired spec from
// spec (a full NodeSpec, or with patch an RFC 7396 merge patch) without
// storing it: the DesiredState that SubmitSpec will store and send.
func (s *Server) PrepareSpec(node string, spec []byte, patch bool) (PreparedSpec, error) {
	n, err := s.nodeForSpec(node)
	if err != nil {
		return PreparedSpec{}, err
	}
	f, err := specChangeFor(n, spec, patch)
	if err != nil {
		return PreparedSpec{}, err
	}
	unlock := s.specLocks.lock(node)
	p, err := s.planSpec(node, f)
	unlock()
	if errors.Is(err, errNoChange) {
		return PreparedSpec{}, fmt.Errorf("nothing to prepare: the desired spec of %s is that already (generation %d)", node, p.base)
	}
	if err != nil {
		return PreparedSpec{}, err
	}
	return PreparedSpec{Node: node, Generation: p.ds.GetGeneration(), Patch: p.ds.GetPatch(), BaseGeneration: p.ds.GetBaseGeneration(), Spec: p.ds.GetSpec()}, nil
}

// ErrPreparedStale refuses a prepared spec whose node's generation moved.
var ErrPreparedStale = errors.New("prepare it again")

// SubmitSpec stores a prepared spec change as the node's next generation
// and sends it with the signature it carries (none for one submitted
// unsigned); bcgw never signs it. It is refused when the node's spec
// generation moved since it was prepared, and when the spec is not the
// one prepare printed. The warning says when agents holding the current
// trust bundle will refuse it.
func (s *Server) SubmitSpec(p PreparedSpec) (uint64, string, error) {
	ds, err := p.Frame()
	if err != nil {
		return 0, "", err
	}
	n, err := s.nodeForSpec(p.Node)
	if err != nil {
		return 0, "", err
	}
	f, err := specChangeFor(n, ds.GetSpec(), ds.GetPatch())
	if err != nil {
		return 0, "", err
	}
	unlock := s.specLocks.lock(p.Node)
	defer unlock()
	cur, err := s.store.Spec(p.Node)
	if err != nil {
		return 0, "", err
	}
	if cur.Generation != ds.GetGeneration()-1 {
		return 0, "", fmt.Errorf("the desired spec of %s is at generation %d; this was prepared as generation %d (on %d): %w",
			p.Node, cur.Generation, ds.GetGeneration(), ds.GetGeneration()-1, ErrPreparedStale)
	}
	plan, err := s.planSpec(p.Node, f)
	if errors.Is(err, errNoChange) {
		return 0, "", fmt.Errorf("the desired spec of %s is that already (generation %d); nothing stored", p.Node, plan.base)
	}
	if err != nil {
		return 0, "", err
	}
	if !bytes.Equal(plan.ds.GetSpec(), ds.GetSpec()) {
		return 0, "", fmt.Errorf("the spec is not as bcgw spec prepare printed it (a full spec is stored in its canonical form; only whitespace may change): %w", ErrPreparedStale)
	}
	warning := s.signatureWarning(func(r *intent.Roots) error { return r.VerifyDesiredState(p.Node, ds) })
	gen, err := s.commitSpecLocked(p.Node, plan, true, ds.GetSignature())
	if errors.Is(err, store.ErrGenerationMoved) {
		err = fmt.Errorf("%w; %w", err, ErrPreparedStale)
	}
	if err == nil {
		s.log.Info("desired spec submitted", "node", p.Node, "generation", gen, "patch", ds.GetPatch(), "signed", len(ds.GetSignature()) > 0, "warning", warning)
	}
	return gen, warning, err
}

// SubmitView answers a submitted spec.
type SubmitView struct {
	Generation uint64 `json:"generation"`
	Warning    string `json:"warning,omitempty"`
}

func (s *Server) adminPrepareSpec(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, nodespec.MaxBytes+1))
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return
	}
	if len(b) > nodespec.MaxBytes {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body is over 4 MiB: a spec or a patch is at most %d bytes", nodespec.MaxBytes))
		return
	}
	patch := false
	switch q := r.URL.Query().Get("patch"); q {
	case "", "false", "0":
	case "true", "1":
		patch = true
	default:
		adminErr(w, http.StatusBadRequest, fmt.Errorf("patch=%q: true or false", truncateString(q, 16)))
		return
	}
	p, err := s.PrepareSpec(r.PathValue("id"), b, patch)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, p)
}

func (s *Server) adminSubmitSpec(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxPrepared+1))
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return
	}
	var p PreparedSpec
	if len(b) > maxPrepared {
		err = fmt.Errorf("request body is over %d bytes", maxPrepared)
	} else if err = strictDecode(b, &p); err != nil {
		err = fmt.Errorf("request body: %w", err)
	} else if p.Node != r.PathValue("id") {
		err = fmt.Errorf("the prepared spec is for %s, not %s", p.Node, r.PathValue("id"))
	}
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	gen, warning, err := s.SubmitSpec(p)
	if err != nil {
		code := errCode(err, http.StatusBadRequest)
		if errors.Is(err, ErrPreparedStale) {
			code = http.StatusConflict
		}
		adminErr(w, code, err)
		return
	}
	writeJSON(w, SubmitView{Generation: gen, Warning: warning})
}
