package gateway

import (
	"bytes"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/base/privfile"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// CommandKeyFile is bcgw's own command-signing key under the data
// directory, made at first start unless Config.CommandKey says otherwise.
const CommandKeyFile = "command-signing.key"

// CommandKeyNone, as Config.CommandKey (bcgw serve --command-key none),
// runs bcgw without a command-signing key of its own: it signs nothing.
const CommandKeyNone = "none"

// metaTrustBundle is the store's meta key of the signed trust bundle.
const metaTrustBundle = "trust/bundle"

// trustDrainRedial is the redial delay a Drain after a bundle change asks.
const trustDrainRedial = 500 * time.Millisecond

// loadCommandKey returns bcgw's own command-signing key: nil for
// CommandKeyNone, the given PEM file (which must exist), or the data
// directory's (or the database's key set's), made (P-256, PKCS#8 PEM,
// 0600) when it is absent.
func loadCommandKey(kf keyFiles, setting string) (crypto.Signer, error) {
	switch setting {
	case CommandKeyNone:
		return nil, nil
	case "":
		return loadOrCreateKey(kf, CommandKeyFile)
	default:
		k, err := ReadSigningKey(setting)
		if err != nil {
			return nil, fmt.Errorf("--command-key: %w", err)
		}
		return k, nil
	}
}

// ReadSigningKey reads a command-signing key (P-256, PKCS#8 PEM "PRIVATE
// KEY") from a file that only its owner may read. Errors name the file,
// never its contents.
func ReadSigningKey(path string) (crypto.Signer, error) {
	b, err := privfile.Read(path, 64<<10, "a PEM private key is far smaller")
	if err != nil {
		return nil, err
	}
	k, err := pki.ParsePrivateKeyPEM(b)
	clear(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// ParsePublicKeyPEM reads a command-signing root: one PEM "PUBLIC KEY"
// block holding an ECDSA P-256 key. It returns the key's SPKI DER as Go
// encodes it (the form the bundle carries and the key id is taken of).
func ParsePublicKeyPEM(b []byte) ([]byte, error) {
	return parsePublicKeyPEM(b, "a command-signing root")
}

// parsePublicKeyPEM reads one PEM "PUBLIC KEY" block holding an ECDSA
// P-256 key, what (for errors) says what the key is to be.
func parsePublicKeyPEM(b []byte, what string) ([]byte, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block found; want a PEM \"PUBLIC KEY\" (openssl ec -pubout)")
	}
	if blk.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("PEM block is %q; want \"PUBLIC KEY\" (a private key is never given to bcgw trust)", truncateString(blk.Type, 40))
	}
	return canonicalKey(blk.Bytes, what)
}

// canonicalRoot checks that der is an ECDSA P-256 SPKI and re-encodes it.
func canonicalRoot(der []byte) ([]byte, error) { return canonicalKey(der, "a command-signing root") }

// canonicalKey checks that der is an ECDSA P-256 SPKI and re-encodes it;
// what (for errors) says what the key is to be.
func canonicalKey(der []byte, what string) ([]byte, error) {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("not a public key: %w", err)
	}
	ep, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("the key is %s; %s must be an ECDSA P-256 key", keyKind(pub), what)
	}
	if ep.Curve != elliptic.P256() {
		return nil, fmt.Errorf("the key is ECDSA on %s; %s must be an ECDSA P-256 key", ep.Curve.Params().Name, what)
	}
	return x509.MarshalPKIXPublicKey(ep)
}

func keyKind(pub any) string {
	switch pub.(type) {
	case *rsa.PublicKey:
		return "an RSA key"
	case ed25519.PublicKey:
		return "an Ed25519 key"
	case *ecdh.PublicKey:
		return "an X25519 key"
	default:
		return fmt.Sprintf("a %T", pub)
	}
}

func truncateString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// pinOfSPKI is the pin of an SPKI DER.
func pinOfSPKI(der []byte) string {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return "(unparseable key)"
	}
	p, err := pki.Pin(pub)
	if err != nil {
		return "(unparseable key)"
	}
	return p
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
func (s *Server) loadTrust() error {
	pin, err := pki.Pin(s.keys.joinSigning.Public())
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
	if s.cmdKey != nil {
		spki, err := x509.MarshalPKIXPublicKey(s.cmdKey.Public())
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
func (s *Server) reloadTrustLocked() (bool, error) {
	pin, err := pki.Pin(s.keys.joinSigning.Public())
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
func (s *Server) reloadTrust() {
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
}

// storeTrust signs doc with the join-signing key, stores it over the
// stored bundle this gateway holds (errTrustMoved when another gateway
// stored one since) and makes it the bundle Welcome carries. The caller
// holds s.trust.mu (or runs before the server does).
func (s *Server) storeTrust(doc bundle.Document) error {
	tb, err := bundle.Sign(s.keys.joinSigning, doc)
	if err != nil {
		return fmt.Errorf("sign the trust bundle: %w", err)
	}
	b, err := json.Marshal(storedBundle{Document: tb.Document, SigningKey: tb.SigningKey, Signature: tb.Signature})
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

// TrustBundle is the signed trust bundle every Welcome carries.
func (s *Server) TrustBundle() *bcdv1.TrustBundle {
	s.trust.mu.Lock()
	defer s.trust.mu.Unlock()
	return proto.Clone(s.trust.tb).(*bcdv1.TrustBundle)
}

// trustRoots are the current bundle's command-signing roots.
func (s *Server) trustRoots() *intent.Roots {
	s.trust.mu.Lock()
	defer s.trust.mu.Unlock()
	return s.trust.doc.Roots()
}

// TrustRoot is one command-signing root as the admin API shows it.
type TrustRoot struct {
	Pin string `json:"pin"`
	// Own: this is bcgw's own command-signing key.
	Own bool `json:"own,omitempty"`
}

// TrustNode is the trust bundle version a node last said it holds.
type TrustNode struct {
	Node         string     `json:"node"`
	Connected    bool       `json:"connected"`
	TrustVersion uint64     `json:"trust_version"`
	At           *time.Time `json:"at,omitempty"`
}

// TrustView is the trust bundle as the admin API and `bcgw trust show`
// show it.
type TrustView struct {
	Version uint64      `json:"version"`
	Roots   []TrustRoot `json:"roots"`
	// OwnKey is the pin of bcgw's own command-signing key ("" when it
	// runs with --command-key none); OwnKeyIsRoot whether the bundle
	// names it.
	OwnKey       string `json:"own_key,omitempty"`
	OwnKeyIsRoot bool   `json:"own_key_is_root"`
	// Approvers is the bundle's approver set (absent: none, and agents
	// run destructive commands without a batch).
	Approvers *ApproversView `json:"approvers,omitempty"`
	Nodes     []TrustNode    `json:"nodes"`
}

// TrustChange answers a change of the trust bundle.
type TrustChange struct {
	Version uint64 `json:"version"`
	// Changed is false when the bundle already was as asked (the version
	// stays).
	Changed bool   `json:"changed"`
	Pin     string `json:"pin"`
	Roots   int    `json:"roots"`
}

// ownSPKI is the SPKI DER of bcgw's own command-signing key (nil: none).
func (s *Server) ownSPKI() []byte {
	if s.cmdKey == nil {
		return nil
	}
	b, _ := x509.MarshalPKIXPublicKey(s.cmdKey.Public())
	return b
}

// OwnCommandKey returns the SPKI DER of bcgw's own command-signing key,
// nil when it runs without one.
func (s *Server) OwnCommandKey() []byte { return s.ownSPKI() }

// Trust returns the trust bundle: version, roots, and the version each
// node last said it holds.
func (s *Server) Trust() (TrustView, error) {
	s.trust.mu.Lock()
	doc := s.trust.doc
	s.trust.mu.Unlock()
	own := s.ownSPKI()
	v := TrustView{Version: doc.Version, Roots: []TrustRoot{}, Nodes: []TrustNode{}}
	if own != nil {
		v.OwnKey = pinOfSPKI(own)
	}
	for _, r := range doc.CommandSigningRoots {
		isOwn := own != nil && bytes.Equal(r, own)
		v.OwnKeyIsRoot = v.OwnKeyIsRoot || isOwn
		v.Roots = append(v.Roots, TrustRoot{Pin: pinOfSPKI(r), Own: isOwn})
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
		_, connected := s.sessionOn(n)
		tn := TrustNode{Node: n.ID, Connected: connected, TrustVersion: n.TrustVersion}
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
func (s *Server) AddTrustRoot(spki []byte) (TrustChange, error) {
	der, err := canonicalRoot(spki)
	if err != nil {
		return TrustChange{}, err
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
func (s *Server) RemoveTrustRoot(spki []byte) (TrustChange, error) {
	der, err := canonicalRoot(spki)
	if err != nil {
		return TrustChange{}, err
	}
	return s.changeTrust(der, func(doc *bundle.Document) (bool, error) {
		i := slices.IndexFunc(doc.CommandSigningRoots, func(r []byte) bool { return bytes.Equal(r, der) })
		if i < 0 {
			return false, fmt.Errorf("%s is not a command-signing root of the trust bundle (bcgw trust show lists them)", pinOfSPKI(der))
		}
		doc.CommandSigningRoots = slices.Delete(slices.Clone(doc.CommandSigningRoots), i, i+1)
		return true, nil
	})
}

// changeTrust changes the command-signing roots (commitTrust) and
// answers with the root der's pin.
func (s *Server) changeTrust(der []byte, f func(doc *bundle.Document) (bool, error)) (TrustChange, error) {
	doc, changed, err := s.commitTrust(f)
	if err != nil {
		if changed {
			return TrustChange{}, err
		}
		return TrustChange{Version: doc.Version, Pin: pinOfSPKI(der), Roots: len(doc.CommandSigningRoots)}, err
	}
	return TrustChange{Version: doc.Version, Changed: changed, Pin: pinOfSPKI(der), Roots: len(doc.CommandSigningRoots)}, nil
}

// commitTrust applies f to a copy of the bundle document; when it changed
// something the next version is signed, stored and sent: every live
// session gets a Drain, and its agent takes the bundle at its next
// Welcome. It returns the document after the change (the held one when
// nothing changed) and whether it changed; an error with changed true
// failed to store the new version, and the held one stays.
func (s *Server) commitTrust(f func(doc *bundle.Document) (bool, error)) (bundle.Document, bool, error) {
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
		s.notify(store.Notice{Kind: store.NoticeTrust})
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

// noteTrustVersion records the trust bundle version an agent said it
// holds.
func (s *Server) noteTrustVersion(node string, v uint64) error {
	_, err := s.store.UpdateNode(node, func(n *store.Node) error {
		n.TrustVersion, n.TrustVersionAt = v, s.now().UTC()
		return nil
	})
	return err
}

// ---- admin API ----

// TrustRootRequest names a command-signing root by its SPKI DER.
type TrustRootRequest struct {
	SPKI []byte `json:"spki"`
}

func (s *Server) adminTrust(w http.ResponseWriter, r *http.Request) {
	v, err := s.Trust()
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, v)
}

func (s *Server) adminTrustRoot(remove bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req TrustRootRequest
		if err := decodeBody(r, &req); err != nil {
			adminErr(w, http.StatusBadRequest, err)
			return
		}
		var c TrustChange
		var err error
		if remove {
			c, err = s.RemoveTrustRoot(req.SPKI)
		} else {
			c, err = s.AddTrustRoot(req.SPKI)
		}
		if err != nil {
			adminErr(w, http.StatusBadRequest, err)
			return
		}
		writeJSON(w, c)
	}
}
