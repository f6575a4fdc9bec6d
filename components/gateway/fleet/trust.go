package fleet

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// CommandKeyNone, as Config.CommandKey (bcgw serve --command-key none),
// runs bcgw without a command-signing key of its own: it signs nothing.
const CommandKeyNone = "none"

// metaTrustBundle is the store's meta key of the signed trust bundle.
const metaTrustBundle = "trust/bundle"

// trustDrainRedial is the redial delay a Drain after a bundle change asks.
const trustDrainRedial = 500 * time.Millisecond

// LoadCommandKey returns bcgw's own command-signing key: nil for
// CommandKeyNone, the given PEM file (which must exist), or the data
// directory's (or the database's key set's), made (P-256, PKCS#8 PEM,
// 0600) when it is absent.
func LoadCommandKey(kf keys.Files, setting string) (crypto.Signer, error) {
	switch setting {
	case CommandKeyNone:
		return nil, nil
	case "":
		return keys.LoadOrCreateKey(kf, keys.CommandKeyFile)
	default:
		k, err := adminapi.ReadSigningKey(setting)
		if err != nil {
			return nil, fmt.Errorf("--command-key: %w", err)
		}
		return k, nil
	}
}

// canonicalRoot checks that der is an ECDSA P-256 SPKI and re-encodes it.
func canonicalRoot(der []byte) ([]byte, error) {
	return adminapi.CanonicalKey(der, "a command-signing root")
}

// storedBundle is the signed trust bundle as the store keeps it.
type storedBundle struct {
	Document   []byte `json:"document"`
	SigningKey []byte `json:"signing_key"`
	Signature  []byte `json:"signature"`
}

// trustState is the gateway's trust bundle: the document and its signed
// frame, sent in every Welcome.
type trustState struct {
	mu  sync.Mutex
	doc bundle.Document
	tb  *bcdv1.TrustBundle
	// raw is the stored value the held bundle came from (nil before one
	// is stored): the next version is written only over it (SwapMeta).
	raw []byte
}

// errTrustMoved: the stored trust bundle is no longer the one this
// gateway holds (another gateway stored a version first).
var errTrustMoved = errors.New("the trust bundle changed on another gateway")

// trustAttempts bounds how often a change starts again from a bundle
// another gateway stored meanwhile.
const trustAttempts = 5

// loadTrust reads the stored trust bundle, or makes version 1 at first
// start: bcgw's own command-signing key as the only root, or no root
// when it has none.
func (s *Fleet) loadTrust() error {
	pin, err := pki.Pin(s.keys.JoinSigning.Public())
	if err != nil {
		return err
	}
	b, err := s.store.Meta(metaTrustBundle)
	if err != nil {
		return err
	}
	if len(b) > 0 {
		var sb storedBundle
		if err := json.Unmarshal(b, &sb); err != nil {
			return fmt.Errorf("stored trust bundle: %w", err)
		}
		tb := &bcdv1.TrustBundle{Document: sb.Document, SigningKey: sb.SigningKey, Signature: sb.Signature}
		doc, err := bundle.Verify(tb, pin)
		if err != nil {
			return fmt.Errorf("the stored trust bundle does not verify with join-signing.key: %w", err)
		}
		tb.Version, tb.CommandSigningRoots = doc.Version, doc.CommandSigningRoots
		s.trust.doc, s.trust.tb, s.trust.raw = doc, tb, b
		return nil
	}
	doc := bundle.Document{Version: 1}
	if s.commandKey() != nil {
		spki, err := x509.MarshalPKIXPublicKey(s.commandKey().Public())
		if err != nil {
			return err
		}
		doc.CommandSigningRoots = [][]byte{spki}
	}
	if err := s.storeTrust(doc); errors.Is(err, errTrustMoved) {
		// Another gateway starting at the same moment made version 1
		// first: hold that one.
		changed, err := s.reloadTrustLocked()
		if err == nil && !changed {
			err = errors.New("the trust bundle another gateway stored is not newer")
		}
		return err
	} else if err != nil {
		return err
	}
	s.log.Info("trust bundle made", "version", doc.Version, "roots", len(doc.CommandSigningRoots))
	return nil
}

// reloadTrustLocked makes the stored trust bundle the held one when it is
// newer (another gateway on the shared store changed it) and says whether
// it was. The caller holds s.trust.mu.
func (s *Fleet) reloadTrustLocked() (bool, error) {
	pin, err := pki.Pin(s.keys.JoinSigning.Public())
	if err != nil {
		return false, err
	}
	b, err := s.store.Meta(metaTrustBundle)
	if err != nil || len(b) == 0 {
		return false, err
	}
	var sb storedBundle
	if err := json.Unmarshal(b, &sb); err != nil {
		return false, fmt.Errorf("stored trust bundle: %w", err)
	}
	tb := &bcdv1.TrustBundle{Document: sb.Document, SigningKey: sb.SigningKey, Signature: sb.Signature}
	doc, err := bundle.Verify(tb, pin)
	if err != nil {
		return false, fmt.Errorf("the stored trust bundle does not verify with join-signing.key: %w", err)
	}
	if doc.Version <= s.trust.doc.Version {
		return false, nil
	}
	tb.Version, tb.CommandSigningRoots = doc.Version, doc.CommandSigningRoots
	s.trust.doc, s.trust.tb, s.trust.raw = doc, tb, b
	return true, nil
}

// reloadTrust takes a trust bundle another gateway stored: when newer, it
// is held and every live session here is drained to take it.
func (s *Fleet) reloadTrust() {
	s.trust.mu.Lock()
	changed, err := s.reloadTrustLocked()
	v := s.trust.doc.Version
	s.trust.mu.Unlock()
	if err != nil {
		s.log.Warn("trust bundle from another gateway not loaded", "err", err)
		return
	}
	if changed {
		n := s.hub.DrainLive("trust bundle changed", trustDrainRedial)
		s.log.Info("trust bundle changed on another gateway", "version", v, "sessions_drained", n)
	}
	// After the drain: the agents take the bundle naming a rotated key
	// before this gateway signs with it (rotate.go).
	s.reloadCommandKey(changed)
}

// storeTrust signs doc with the join-signing key, stores it over the
// stored bundle this gateway holds (errTrustMoved when another gateway
// stored one since) and makes it the bundle Welcome carries. The caller
// holds s.trust.mu (or runs before the server does).
func (s *Fleet) storeTrust(doc bundle.Document) error {
	tb, b, err := s.signTrust(doc)
	if err != nil {
		return err
	}
	swapped, err := s.store.SwapMeta(metaTrustBundle, s.trust.raw, b)
	if err != nil {
		return fmt.Errorf("store the trust bundle: %w", err)
	}
	if !swapped {
		return fmt.Errorf("store the trust bundle version %d: %w", doc.Version, errTrustMoved)
	}
	s.trust.doc, s.trust.tb, s.trust.raw = doc, tb, b
	return nil
}

// signTrust signs doc with the join-signing key: the frame Welcome
// carries and the value the store keeps.
func (s *Fleet) signTrust(doc bundle.Document) (*bcdv1.TrustBundle, []byte, error) {
	tb, err := bundle.Sign(s.keys.JoinSigning, doc)
	if err != nil {
		return nil, nil, fmt.Errorf("sign the trust bundle: %w", err)
	}
	b, err := json.Marshal(storedBundle{Document: tb.Document, SigningKey: tb.SigningKey, Signature: tb.Signature})
	return tb, b, err
}

// TrustBundle is the signed trust bundle every Welcome carries.
func (s *Fleet) TrustBundle() *bcdv1.TrustBundle {
	s.trust.mu.Lock()
	defer s.trust.mu.Unlock()
	return proto.Clone(s.trust.tb).(*bcdv1.TrustBundle)
}

// trustRoots are the current bundle's command-signing roots.
func (s *Fleet) trustRoots() *intent.Roots {
	s.trust.mu.Lock()
	defer s.trust.mu.Unlock()
	return s.trust.doc.Roots()
}

// ownSPKI is the SPKI DER of bcgw's own command-signing key (nil: none).
func (s *Fleet) ownSPKI() []byte {
	if s.commandKey() == nil {
		return nil
	}
	b, _ := x509.MarshalPKIXPublicKey(s.commandKey().Public())
	return b
}

// OwnCommandKey returns the SPKI DER of bcgw's own command-signing key,
// nil when it runs without one.
func (s *Fleet) OwnCommandKey() []byte { return s.ownSPKI() }

// Trust returns the trust bundle: version, roots, and the version each
// node last said it holds.
func (s *Fleet) Trust() (adminapi.TrustView, error) {
	s.trust.mu.Lock()
	doc := s.trust.doc
	s.trust.mu.Unlock()
	own := s.ownSPKI()
	v := adminapi.TrustView{Version: doc.Version, Roots: []adminapi.TrustRoot{}, Nodes: []adminapi.TrustNode{}}
	if own != nil {
		v.OwnKey = adminapi.PinOfSPKI(own)
	}
	for _, r := range doc.CommandSigningRoots {
		isOwn := own != nil && bytes.Equal(r, own)
		v.OwnKeyIsRoot = v.OwnKeyIsRoot || isOwn
		v.Roots = append(v.Roots, adminapi.TrustRoot{Pin: adminapi.PinOfSPKI(r), Own: isOwn})
	}
	v.Approvers = viewApprovers(doc.Approvers)
	nodes, err := s.store.Nodes()
	if err != nil {
		return v, err
	}
	for _, n := range nodes {
		if n.Revoked {
			continue
		}
		_, connected := s.SessionOn(n)
		tn := adminapi.TrustNode{Node: n.ID, Connected: connected, TrustVersion: n.TrustVersion}
		if !n.TrustVersionAt.IsZero() {
			at := n.TrustVersionAt
			tn.At = &at
		}
		v.Nodes = append(v.Nodes, tn)
	}
	return v, nil
}

// AddTrustRoot adds a command-signing root (SPKI DER of a P-256 key) to
// the trust bundle: a new version, after which every live session is
// drained so each agent gets it at its next Welcome. A key that already is
// a root changes nothing.
func (s *Fleet) AddTrustRoot(spki []byte) (adminapi.TrustChange, error) {
	der, err := canonicalRoot(spki)
	if err != nil {
		return adminapi.TrustChange{}, err
	}
	return s.changeTrust(der, func(doc *bundle.Document) (bool, error) {
		if slices.ContainsFunc(doc.CommandSigningRoots, func(r []byte) bool { return bytes.Equal(r, der) }) {
			return false, nil
		}
		if len(doc.CommandSigningRoots) >= intent.MaxRoots {
			return false, fmt.Errorf("the trust bundle names %d command-signing roots already, the most it may", intent.MaxRoots)
		}
		doc.CommandSigningRoots = append(slices.Clone(doc.CommandSigningRoots), der)
		return true, nil
	})
}

// RemoveTrustRoot removes a command-signing root from the trust bundle (a
// new version; live sessions are drained). With no root left, agents no
// longer enforce signed intent.
func (s *Fleet) RemoveTrustRoot(spki []byte) (adminapi.TrustChange, error) {
	der, err := canonicalRoot(spki)
	if err != nil {
		return adminapi.TrustChange{}, err
	}
	return s.changeTrust(der, func(doc *bundle.Document) (bool, error) {
		i := slices.IndexFunc(doc.CommandSigningRoots, func(r []byte) bool { return bytes.Equal(r, der) })
		if i < 0 {
			return false, fmt.Errorf("%s is not a command-signing root of the trust bundle (bcgw trust show lists them)", adminapi.PinOfSPKI(der))
		}
		doc.CommandSigningRoots = slices.Delete(slices.Clone(doc.CommandSigningRoots), i, i+1)
		return true, nil
	})
}

// changeTrust changes the command-signing roots (commitTrust) and
// answers with the root der's pin.
func (s *Fleet) changeTrust(der []byte, f func(doc *bundle.Document) (bool, error)) (adminapi.TrustChange, error) {
	doc, changed, err := s.commitTrust(f)
	if err != nil {
		if changed {
			return adminapi.TrustChange{}, err
		}
		return adminapi.TrustChange{Version: doc.Version, Pin: adminapi.PinOfSPKI(der), Roots: len(doc.CommandSigningRoots)}, err
	}
	return adminapi.TrustChange{Version: doc.Version, Changed: changed, Pin: adminapi.PinOfSPKI(der), Roots: len(doc.CommandSigningRoots)}, nil
}

// commitTrust applies f to a copy of the bundle document; when it changed
// something the next version is signed, stored and sent: every live
// session gets a Drain, and its agent takes the bundle at its next
// Welcome. It returns the document after the change (the held one when
// nothing changed) and whether it changed; an error with changed true
// failed to store the new version, and the held one stays.
func (s *Fleet) commitTrust(f func(doc *bundle.Document) (bool, error)) (bundle.Document, bool, error) {
	s.trust.mu.Lock()
	var doc bundle.Document
	for attempt := 1; ; attempt++ {
		if s.shared != nil {
			// Another gateway may have changed it since: start from the stored one.
			if _, err := s.reloadTrustLocked(); err != nil {
				s.trust.mu.Unlock()
				return s.trust.doc, false, err
			}
		}
		doc = s.trust.doc
		changed, err := f(&doc)
		if err != nil || !changed {
			held := s.trust.doc
			s.trust.mu.Unlock()
			return held, false, err
		}
		doc.Version++
		err = s.storeTrust(doc)
		if err == nil {
			break
		}
		// Another gateway stored a version since the reload: apply the
		// change again to that one.
		if !errors.Is(err, errTrustMoved) || attempt == trustAttempts {
			s.trust.mu.Unlock()
			return doc, true, err
		}
	}
	s.trust.mu.Unlock()
	if s.shared != nil {
		// The other gateways load it and drain their sessions too.
		s.Notify(store.Notice{Kind: store.NoticeTrust})
	}
	// The new bundle is in place before the sessions are listed: a session
	// registered after this point builds its Welcome with it.
	n := s.hub.DrainLive("trust bundle changed", trustDrainRedial)
	approvers := uint64(0)
	if doc.Approvers != nil {
		approvers = doc.Approvers.Epoch
	}
	s.log.Info("trust bundle changed", "version", doc.Version, "roots", len(doc.CommandSigningRoots), "approver_epoch", approvers, "sessions_drained", n)
	return doc, true, nil
}

// NoteTrustVersion records the trust bundle version an agent said it
// holds.
func (s *Fleet) NoteTrustVersion(node string, v uint64) error {
	_, err := s.store.UpdateNode(node, func(n *store.Node) error {
		n.TrustVersion, n.TrustVersionAt = v, s.now().UTC()
		return nil
	})
	return err
}
