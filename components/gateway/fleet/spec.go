package fleet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/intent"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// keyedMutex is one mutex per key (a node id): updates of one node's spec
// are serialized, and so are the DesiredState frames they queue.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*sync.Mutex{}
	}
	l := k.m[key]
	if l == nil {
		l = &sync.Mutex{}
		k.m[key] = l
	}
	k.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// errNoChange from a specChange means the stored spec stays as it is.
var errNoChange = errors.New("no change")

// specChange computes a node's next spec from the stored one. It returns
// the next full spec and, when the change goes to the agent as a merge
// patch, that patch (nil: the full spec is sent).
type specChange func(cur nodespec.Spec) (next nodespec.Spec, patch []byte, err error)

// changeSpec applies f to the node's stored spec under the node's lock:
// the next generation is stored first, then sent to the node's live
// session (a patch with base_generation, or the full spec). A result equal
// to the stored spec changes nothing and returns the current generation.
func (s *Fleet) changeSpec(node string, f specChange) (uint64, error) {
	unlock := s.specLocks.lock(node)
	defer unlock()
	return s.changeSpecLocked(node, f)
}

func (s *Fleet) changeSpecLocked(node string, f specChange) (uint64, error) {
	p, err := s.planSpec(node, f)
	if errors.Is(err, errNoChange) {
		return p.base, nil
	}
	if err != nil {
		return 0, err
	}
	return s.commitSpecLocked(node, p, false, nil)
}

// specPlan is a spec change worked out against the stored spec: the next
// full spec and the DesiredState (not signed yet) that carries it.
type specPlan struct {
	base uint64              // the stored generation it applies on
	next []byte              // the next full spec, canonical
	ds   *bcdv1.DesiredState // generation base+1: the full spec, or the patch with base_generation
}

// planSpec applies f to the node's stored spec. errNoChange (with base
// set) when the spec would stay as it is. The caller holds the node's
// spec lock.
func (s *Fleet) planSpec(node string, f specChange) (specPlan, error) {
	cur, err := s.store.Spec(node)
	if err != nil {
		return specPlan{}, err
	}
	p := specPlan{base: cur.Generation}
	held, err := nodespec.Decode(cur.Spec)
	if len(cur.Spec) == 0 {
		held, err = nodespec.Spec{}, nil
	}
	if err != nil {
		return p, fmt.Errorf("the stored spec of %s does not decode: %w", node, err)
	}
	next, patch, err := f(held)
	if err != nil {
		return p, err
	}
	b := next.Encode()
	if len(b) > nodespec.MaxBytes {
		return p, fmt.Errorf("the spec would be %d bytes; at most %d (4 MiB)", len(b), nodespec.MaxBytes)
	}
	if cur.Generation > 0 && bytes.Equal(b, cur.Spec) {
		return p, errNoChange
	}
	p.next = b
	p.ds = &bcdv1.DesiredState{Generation: cur.Generation + 1, Spec: b}
	if patch != nil {
		p.ds = &bcdv1.DesiredState{Generation: cur.Generation + 1, Patch: true, Spec: patch, BaseGeneration: cur.Generation}
	}
	return p, nil
}

// commitSpecLocked stores a planned change as the next generation, then
// sends it to the node's live session. The frame is signed by bcgw's own
// key, unless it was submitted: then it goes as it came, with sig (none
// for one submitted unsigned). The caller holds the node's spec lock.
func (s *Fleet) commitSpecLocked(node string, p specPlan, submitted bool, sig []byte) (uint64, error) {
	ds := proto.Clone(p.ds).(*bcdv1.DesiredState)
	if submitted {
		ds.Signature = sig
	} else if err := s.signDesired(node, ds, p.next); err != nil {
		return 0, err
	}
	var rec store.Spec
	var err error
	if submitted && !ds.GetPatch() {
		rec, err = s.store.PutSubmittedSpec(node, p.base, p.next, sig, s.now().UTC())
	} else {
		rec, err = s.store.PutSpec(node, p.base, p.next, s.now().UTC())
	}
	if err != nil {
		return 0, err
	}
	sent := false
	if l := s.hub.Get(node); l != nil && l.SpecReady.Load() {
		if !ds.GetPatch() {
			l.FullGen.Store(rec.Generation)
		}
		// In order, under the node's lock: the agent sees the generations
		// one after another.
		l.Push(hub.Frame{F: desiredFrame(ds)})
		sent = true
	} else if s.shared != nil {
		// Its session may be on another gateway, which sends it in full.
		s.Notify(store.Notice{Kind: store.NoticeSpec, Node: node})
	}
	s.log.Debug("desired spec changed", "node", node, "generation", rec.Generation, "patch", ds.GetPatch(), "sent", sent,
		"signed", len(ds.GetSignature()) > 0, "submitted", submitted)
	return rec.Generation, nil
}

// signDesired signs ds, which makes the full spec full (canonical bytes),
// for node with bcgw's own command-signing key; with none it stays
// unsigned.
func (s *Fleet) signDesired(node string, ds *bcdv1.DesiredState, full []byte) error {
	if s.commandKey() == nil {
		return nil
	}
	spec, err := nodespec.Decode(full)
	if err != nil {
		return fmt.Errorf("sign the desired state of %s: %w", node, err)
	}
	sig, err := intent.SignDesiredState(s.commandKey(), node, ds, spec)
	if err != nil {
		return fmt.Errorf("sign the desired state of %s: %w", node, err)
	}
	ds.Signature = sig
	return nil
}

func desiredFrame(ds *bcdv1.DesiredState) *bcdv1.GatewayFrame {
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_DesiredState{DesiredState: ds}}
}

// FullSpecFrame is the node's stored spec in full, nil when it has none:
// with the signature it was submitted with, else signed by bcgw's own key
// (when it has one).
func (s *Fleet) FullSpecFrame(node string) (*bcdv1.GatewayFrame, uint64, error) {
	rec, err := s.store.Spec(node)
	if err != nil {
		return nil, 0, err
	}
	return s.SpecFrame(node, rec)
}

// SpecFrame is FullSpecFrame of the node's spec record rec, as read.
func (s *Fleet) SpecFrame(node string, rec store.Spec) (*bcdv1.GatewayFrame, uint64, error) {
	if rec.Generation == 0 {
		return nil, 0, nil
	}
	ds := &bcdv1.DesiredState{Generation: rec.Generation, Spec: rec.Spec}
	if rec.Submitted {
		ds.Signature = rec.Signature
	} else if err := s.signDesired(node, ds, rec.Spec); err != nil {
		return nil, 0, err
	}
	return desiredFrame(ds), rec.Generation, nil
}

// NodeForSpec is the node a spec change names, with an error naming the
// fix when there is no such node.
func (s *Fleet) NodeForSpec(node string) (store.Node, error) {
	n, err := s.store.Node(node)
	if err != nil {
		return n, fmt.Errorf("node %s: %w (bcgw nodes lists the nodes this gateway knows)", node, err)
	}
	return n, nil
}

// specRefused wraps what is wrong with an operator's spec or patch.
func specRefused(what, node string, err error) error {
	return fmt.Errorf("%s for %s refused, nothing stored: %w (a NodeSpec is a JSON object of sections %v, at most 4 MiB)",
		what, node, err, nodespec.Order)
}

// fullChange is the change that replaces a node's spec with spec (a full
// NodeSpec). On a site agent the gateway's site.boot_lease is kept as it
// is, whatever spec says of it.
func fullChange(n store.Node, spec []byte) (specChange, error) {
	next, err := nodespec.Decode(spec)
	if err != nil {
		return nil, specRefused("spec", n.ID, err)
	}
	return func(cur nodespec.Spec) (nodespec.Spec, []byte, error) {
		next := maps.Clone(next)
		if n.Role == "site" {
			if err := keepBootLease(cur, next); err != nil {
				return nil, nil, specRefused("spec", n.ID, err)
			}
		}
		return next, nil, nil
	}, nil
}

// patchChange is the change that applies patch (an RFC 7396 merge patch,
// a JSON object) to a node's spec; the agent gets the patch (compacted)
// with the generation it applies on. A patch may not name a site agent's
// site.boot_lease, which is the gateway's.
func patchChange(n store.Node, patch []byte) (specChange, error) {
	if len(patch) > nodespec.MaxBytes {
		return nil, specRefused("patch", n.ID, fmt.Errorf("patch is %d bytes; at most %d", len(patch), nodespec.MaxBytes))
	}
	var c bytes.Buffer
	if err := json.Compact(&c, patch); err != nil || c.Len() == 0 || c.Bytes()[0] != '{' {
		return nil, specRefused("patch", n.ID, errors.New("patch is not a JSON object"))
	}
	p := c.Bytes()
	if n.Role == "site" {
		if err := patchSparesBootLease(p); err != nil {
			return nil, specRefused("patch", n.ID, err)
		}
	}
	return func(cur nodespec.Spec) (nodespec.Spec, []byte, error) {
		next, err := nodespec.Merge(cur.Encode(), p)
		if err != nil {
			return nil, nil, specRefused("patch", n.ID, err)
		}
		return next, p, nil
	}, nil
}

// specChangeFor is fullChange or patchChange.
func specChangeFor(n store.Node, spec []byte, patch bool) (specChange, error) {
	if patch {
		return patchChange(n, spec)
	}
	return fullChange(n, spec)
}

// SetSpec replaces a node's desired spec with spec (a full NodeSpec) and
// returns its generation. On a site agent the gateway's site.boot_lease is
// kept as it is, whatever spec says of it.
func (s *Fleet) SetSpec(node string, spec []byte) (uint64, error) {
	n, err := s.NodeForSpec(node)
	if err != nil {
		return 0, err
	}
	f, err := fullChange(n, spec)
	if err != nil {
		return 0, err
	}
	gen, err := s.changeSpec(node, f)
	if err == nil {
		s.log.Info("desired spec set", "node", node, "generation", gen)
	}
	return gen, err
}

// PatchSpec applies patch (an RFC 7396 merge patch, a JSON object) to a
// node's desired spec and returns its generation; the agent gets the patch
// with the generation it applies on. A patch may not name a site agent's
// site.boot_lease, which is the gateway's.
func (s *Fleet) PatchSpec(node string, patch []byte) (uint64, error) {
	n, err := s.NodeForSpec(node)
	if err != nil {
		return 0, err
	}
	f, err := patchChange(n, patch)
	if err != nil {
		return 0, err
	}
	gen, err := s.changeSpec(node, f)
	if err == nil {
		s.log.Info("desired spec patched", "node", node, "generation", gen)
	}
	return gen, err
}

// Spec returns a node's desired spec and its generation (0 and an empty
// object when it has none).
func (s *Fleet) Spec(node string) (uint64, []byte, error) {
	rec, err := s.store.Spec(node)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil, fmt.Errorf("node %s: %w (bcgw nodes lists the nodes this gateway knows)", node, store.ErrNotFound)
	}
	if err != nil {
		return 0, nil, err
	}
	if rec.Generation == 0 {
		return 0, []byte("{}"), nil
	}
	return rec.Generation, rec.Spec, nil
}

// patchSection is a merge patch that sets one key of one section.
func patchSection(section, key string, v any) ([]byte, error) {
	return json.Marshal(map[string]map[string]any{section: {key: v}})
}

// setSectionKey merges {section: {key: v}} into spec.
func setSectionKey(cur nodespec.Spec, section, key string, v any) (nodespec.Spec, []byte, error) {
	p, err := patchSection(section, key, v)
	if err != nil {
		return nil, nil, err
	}
	next, err := nodespec.Merge(cur.Encode(), p)
	if err != nil {
		return nil, nil, err
	}
	return next, p, nil
}

// sectionObject decodes a section that must be a JSON object (absent: an
// empty one).
func sectionObject(spec nodespec.Spec, name string) (map[string]json.RawMessage, error) {
	m := map[string]json.RawMessage{}
	body, ok := spec[name]
	if !ok {
		return m, nil
	}
	if b := bytes.TrimSpace(body); len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &m) != nil {
		return nil, fmt.Errorf("the %s section is not a JSON object", name)
	}
	return m, nil
}

// keepBootLease makes next's site.boot_lease what cur holds (none when cur
// has none): the boot lease is granted by the gateway alone.
func keepBootLease(cur, next nodespec.Spec) error {
	held, err := sectionObject(cur, "site")
	if err != nil {
		held = map[string]json.RawMessage{}
	}
	site, err := sectionObject(next, "site")
	if err != nil {
		return err
	}
	lease, ok := held["boot_lease"]
	_, asked := site["boot_lease"]
	switch {
	case ok:
		site["boot_lease"] = lease
	case asked:
		delete(site, "boot_lease")
	default:
		return nil
	}
	b, err := json.Marshal(site)
	if err != nil {
		return err
	}
	next["site"] = b
	return nil
}

// patchSparesBootLease refuses a merge patch that would change a site
// agent's site.boot_lease: naming it, or replacing the site section.
func patchSparesBootLease(patch []byte) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(patch, &top); err != nil {
		return errors.New("patch is not a JSON object")
	}
	site, ok := top["site"]
	if !ok {
		return nil
	}
	var m map[string]json.RawMessage
	if b := bytes.TrimSpace(site); len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &m) != nil {
		return errors.New("the patch replaces or removes the site section, whose boot_lease is the gateway's; patch the site section's own keys instead")
	}
	if _, ok := m["boot_lease"]; ok {
		return errors.New("site.boot_lease is granted by the gateway alone; leave it out of the patch")
	}
	return nil
}
