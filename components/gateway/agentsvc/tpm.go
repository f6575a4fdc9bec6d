package agentsvc

// The tpm attestor: a join with no token, admitted because the TPM's EK is
// enrolled (bcgw tpm enroll --ek-pub) or certified by an enrolled EK CA
// (--ek-ca), the AK is proved to live in that TPM by credential activation,
// and the AK certified the join key over sha256(csr). The certificate names
// the AK (identity.OIDTPMAK), and every renewal of such a node must carry
// the AK's certification of the next key. See docs/tpm.md.

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm"
	"github.com/better-compute/bcd/components/trust/tpm/ek"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

const (
	// MaxTPMRounds is how many challenges one tpm join request may be given.
	MaxTPMRounds = 3
	// tpmChallengeTTL is how long a challenge may be answered.
	tpmChallengeTTL = 2 * time.Minute
	// maxTPMChallenges bounds the open challenges (every one needs an
	// enrolled EK, so this is only a backstop).
	maxTPMChallenges = 10000
	// maxTPMField bounds each byte field of TPMAttestation; an EK
	// certificate may be larger.
	maxTPMField     = 1 << 10
	maxEKCertSize   = 8 << 10
	tpmSecretLength = 32
)

// tpmChallenges are the open credential activation challenges. They live in
// memory: a restarted bcgw forgets them, and the agent's next answer, naming
// an unknown challenge, is given a new one (another round).
type tpmChallenges struct {
	mu      sync.Mutex
	pending map[string]*tpmChallenge // id -> open challenge
	used    map[string]time.Time     // id -> when it may be forgotten
	rounds  map[[32]byte][]time.Time // request binding -> challenges issued
}

type tpmChallenge struct {
	binding [32]byte
	secret  []byte
	expires time.Time
}

// expire drops what is past its time; c.mu is held.
func (c *tpmChallenges) expire(now time.Time) {
	for id, ch := range c.pending {
		if now.After(ch.expires) {
			delete(c.pending, id) // an answer to it gets a new challenge
		}
	}
	for id, t := range c.used {
		if now.After(t) {
			delete(c.used, id)
		}
	}
	for b, ts := range c.rounds {
		if len(ts) == 0 || now.Sub(ts[len(ts)-1]) > 2*tpmChallengeTTL {
			delete(c.rounds, b)
		}
	}
}

// open records a new challenge for binding and returns its round, or an
// error when the request was given MaxTPMRounds challenges already.
func (c *tpmChallenges) open(id string, binding [32]byte, secret []byte, now time.Time) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending, c.used, c.rounds = map[string]*tpmChallenge{}, map[string]time.Time{}, map[[32]byte][]time.Time{}
	}
	c.expire(now)
	if len(c.rounds[binding]) >= MaxTPMRounds {
		return 0, fmt.Errorf("this request was given %d TPM challenges already; start a new join", MaxTPMRounds)
	}
	if len(c.pending) >= maxTPMChallenges {
		return 0, errors.New("too many open TPM challenges; try again later")
	}
	c.pending[id] = &tpmChallenge{binding: binding, secret: secret, expires: now.Add(tpmChallengeTTL)}
	c.rounds[binding] = append(c.rounds[binding], now)
	return len(c.rounds[binding]), nil
}

// errUnknownChallenge is an answer to a challenge this gateway does not
// hold (expired, or issued before a restart): the agent gets a new one.
var errUnknownChallenge = errors.New("unknown TPM challenge")

// answer checks an answer and closes the challenge whatever the outcome, so
// an answer is accepted at most once.
func (c *tpmChallenges) answer(id string, binding [32]byte, answer []byte, now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		return errUnknownChallenge
	}
	c.expire(now)
	if _, ok := c.used[id]; ok {
		return fmt.Errorf("TPM challenge %s was already answered", id)
	}
	ch, ok := c.pending[id]
	if !ok {
		return errUnknownChallenge
	}
	delete(c.pending, id)
	c.used[id] = ch.expires.Add(tpmChallengeTTL)
	if ch.binding != binding {
		return fmt.Errorf("TPM challenge %s was made for another request", id)
	}
	if subtle.ConstantTimeCompare(ch.secret, answer) != 1 {
		return errors.New("the TPM challenge was answered wrongly: the AK is not in the TPM that holds this EK")
	}
	return nil
}

// tpmBinding is what a challenge is bound to: every field of the request but
// the answer, so an answer counts only for the request it was made for.
func tpmBinding(m *bcdv1.JoinRequest) [32]byte {
	h := sha256.New()
	a := m.GetTpm()
	for _, b := range [][]byte{[]byte("bcd/tpm-challenge/v1"), []byte(m.GetRole()), m.GetCsr(),
		a.GetEkPublic(), a.GetEkCertificate(), a.GetAkPublic(), a.GetKeyPublic(), a.GetCertifyInfo(), a.GetCertifySignature()} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// joinTPM admits an agent with the tpm attestor.
func (s *Service) joinTPM(ctx context.Context, m *bcdv1.JoinRequest) (*connect.Response[bcdv1.JoinResponse], error) {
	log := s.log.With("rpc", "Join", "attestor", "tpm", "role", m.GetRole())
	refuse := func(code connect.Code, format string, a ...any) error {
		err := connectErr(code, format, a...)
		log.Warn("join refused", "reason", fmt.Sprintf(format, a...))
		return err
	}
	a := m.GetTpm()
	if m.GetRole() != "node" && m.GetRole() != "site" {
		return nil, refuse(connect.CodeInvalidArgument, "role %q cannot join with attestor \"tpm\"", m.GetRole())
	}
	if a == nil || m.GetSealedToken() != "" {
		return nil, refuse(connect.CodeInvalidArgument, "a tpm join carries TPM evidence and no sealed token")
	}
	for name, f := range map[string][]byte{"ek_public": a.GetEkPublic(), "ak_public": a.GetAkPublic(), "key_public": a.GetKeyPublic(),
		"certify_info": a.GetCertifyInfo(), "certify_signature": a.GetCertifySignature(), "challenge_answer": a.GetChallengeAnswer()} {
		if len(f) > maxTPMField {
			return nil, refuse(connect.CodeInvalidArgument, "tpm.%s is %d bytes, at most %d", name, len(f), maxTPMField)
		}
	}
	if len(a.GetEkCertificate()) > maxEKCertSize || len(a.GetChallengeId()) > 64 {
		return nil, refuse(connect.CodeInvalidArgument, "tpm.ek_certificate or tpm.challenge_id is too large")
	}
	csr, err := pki.ParseCSR(m.GetCsr())
	if err != nil {
		return nil, refuse(connect.CodeInvalidArgument, "csr: %v", err)
	}
	enr, ekPin, err := s.CheckEK(a.GetEkPublic(), a.GetEkCertificate())
	if err != nil {
		return nil, refuse(connect.CodePermissionDenied, "%v", err)
	}
	log = log.With("ek", ekPin)
	if enr.Role != m.GetRole() {
		return nil, refuse(connect.CodePermissionDenied, "the EK is enrolled for role %s, not %s", enr.Role, m.GetRole())
	}
	sum := sha256.Sum256(m.GetCsr())
	if err := checkCertification(a.GetAkPublic(), a.GetKeyPublic(), a.GetCertifyInfo(), a.GetCertifySignature(), csr, sum); err != nil {
		return nil, refuse(connect.CodePermissionDenied, "%v", err)
	}
	binding := tpmBinding(m)
	now := s.now()
	if id := a.GetChallengeId(); id != "" {
		var err error
		if s.shared != nil {
			err = s.answerShared(id, binding, a.GetChallengeAnswer(), now)
		} else {
			err = s.tpm.answer(id, binding, a.GetChallengeAnswer(), now)
		}
		if err != nil && !errors.Is(err, errUnknownChallenge) {
			return nil, refuse(connect.CodePermissionDenied, "%v", err)
		}
		if err == nil {
			return s.admitTPM(m, csr, enr, ekPin, sum, log)
		}
		log.Info("answer to an unknown TPM challenge; asking another", "challenge", id)
	}
	secret := make([]byte, tpmSecretLength)
	if _, err := rand.Read(secret); err != nil {
		return nil, connectErr(connect.CodeInternal, "challenge secret: %v", err)
	}
	blob, enc, err := ek.MakeCredential(a.GetEkPublic(), a.GetAkPublic(), secret)
	if err != nil {
		return nil, refuse(connect.CodePermissionDenied, "%v", err)
	}
	id := "tc_" + fleet.RandomID(13)
	round, err := s.tpm.open(id, binding, secret, now)
	if err != nil {
		return nil, refuse(connect.CodePermissionDenied, "%v", err)
	}
	if s.shared != nil {
		if err := s.openShared(id, binding, secret, now); err != nil {
			return nil, connectErr(connect.CodeUnavailable, "storing the TPM challenge: %v", err)
		}
	}
	log.Info("TPM challenge sent", "challenge", id, "round", round)
	return connect.NewResponse(&bcdv1.JoinResponse{Challenge: &bcdv1.TPMChallenge{
		Id: id, CredentialBlob: blob, EncryptedSecret: enc, Round: int32(round),
	}}), nil
}

// checkCertification checks the AK's certification of the CSR's key over
// qualifying data sum (sha256 of the CSR): a bcd AK, a bcd node key whose
// point is the CSR's public key, and TPM2_Certify's attestation verified.
func checkCertification(akPub, keyPub, attest, sig []byte, csr *x509.CertificateRequest, sum [32]byte) error {
	kp, err := tpm.CheckNodeKeyPublic(keyPub)
	if err != nil {
		return fmt.Errorf("the certified key: %w", err)
	}
	cp, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || !cp.Equal(kp) {
		return errors.New("the certified key is not the CSR's key")
	}
	if err := tpm.VerifyCertify(akPub, attest, sig, keyPub, sum); err != nil {
		return err
	}
	return nil
}

// admitTPM records the node and answers its certificate, which names the AK.
func (s *Service) admitTPM(m *bcdv1.JoinRequest, csr *x509.CertificateRequest, enr fleet.TPMEnrolment, ekPin string, sum [32]byte, log interface {
	Info(string, ...any)
}) (*connect.Response[bcdv1.JoinResponse], error) {
	akName, err := ek.Name(m.GetTpm().GetAkPublic())
	if err != nil {
		return nil, connectErr(connect.CodeInvalidArgument, "AK: %v", err)
	}
	n := store.Node{
		ID: "node_" + fleet.RandomID(13), Role: m.GetRole(), Site: enr.Site, Hostname: m.GetClaims().GetHostname(),
		JoinedAt: s.now().UTC(), AK: hex.EncodeToString(akName), AKPublic: m.GetTpm().GetAkPublic(), EK: ekPin,
	}
	resp, err := s.admit(n, csr, sum)
	if err != nil {
		return nil, err
	}
	log.Info("node joined", "node", n.ID, "site", n.Site, "ak", n.AK, "hostname", n.Hostname)
	return resp, nil
}

// akExtension is the certificate extension naming a node's AK, none for a
// node that did not join with the tpm attestor.
func akExtension(n store.Node) []pkix.Extension {
	if n.AK == "" {
		return nil
	}
	name, err := hex.DecodeString(n.AK)
	if err != nil {
		return nil
	}
	v, err := asn1.Marshal(name)
	if err != nil {
		return nil
	}
	return []pkix.Extension{{Id: identity.OIDTPMAK, Value: v}}
}

// checkRenewalCertification requires, for a node whose AK bcgw knows, the
// AK's certification of the renewal's key over sha256(csr).
func (s *Service) checkRenewalCertification(n store.Node, r *bcdv1.RenewRequest, csr *x509.CertificateRequest) error {
	if n.AK == "" {
		return nil
	}
	c := r.GetCertification()
	if c == nil {
		return connectErr(connect.CodePermissionDenied, "this node joined with its TPM: a renewal must carry the AK's certification of the next key")
	}
	if len(c.GetKeyPublic()) > maxTPMField || len(c.GetCertifyInfo()) > maxTPMField || len(c.GetCertifySignature()) > maxTPMField {
		return connectErr(connect.CodeInvalidArgument, "certification fields are too large")
	}
	sum := sha256.Sum256(r.GetCsr())
	if err := checkCertification(n.AKPublic, c.GetKeyPublic(), c.GetCertifyInfo(), c.GetCertifySignature(), csr, sum); err != nil {
		return connectErr(connect.CodePermissionDenied, "renewal certification: %v", err)
	}
	return nil
}

// ---- enrolment ----

// With several gateways on one database, a challenge is also kept in the
// store, so the answer is checked by whichever gateway it reaches (an
// agent's second call may ride another connection through the balancer).
// The store keeps the secret's SHA-256, not the secret. The rounds a
// request was given stay counted by each gateway in memory.
const metaTPMChallengePrefix = "tpm/challenge/"

type storedChallenge struct {
	Binding string    `json:"binding"`     // hex
	Secret  string    `json:"secret_hash"` // hex SHA-256 of the secret
	Expires time.Time `json:"expires"`
	// Used: answered (kept a while after, so a replay is told so).
	Used bool `json:"used,omitempty"`
}

func (s *Service) openShared(id string, binding [32]byte, secret []byte, now time.Time) error {
	sum := sha256.Sum256(secret)
	b, _ := json.Marshal(storedChallenge{Binding: hex.EncodeToString(binding[:]), Secret: hex.EncodeToString(sum[:]), Expires: now.Add(tpmChallengeTTL)})
	return s.store.SetMeta(metaTPMChallengePrefix+id, b)
}

// answerShared checks an answer against the stored challenge and takes
// the challenge whatever the outcome (a compare-and-swap to used), so of
// answers reaching several gateways at once one is checked and the
// others are "already answered".
func (s *Service) answerShared(id string, binding [32]byte, answer []byte, now time.Time) error {
	key := metaTPMChallengePrefix + id
	old, err := s.store.Meta(key)
	if errors.Is(err, store.ErrNotFound) || err == nil && len(old) == 0 {
		return errUnknownChallenge
	}
	if err != nil {
		return err
	}
	var ch storedChallenge
	if err := json.Unmarshal(old, &ch); err != nil {
		return fmt.Errorf("the stored TPM challenge %s: %w", id, err)
	}
	if ch.Used {
		return fmt.Errorf("TPM challenge %s was already answered", id)
	}
	if now.After(ch.Expires) {
		return errUnknownChallenge // as an expired challenge in memory: a new one
	}
	used := ch
	used.Used, used.Expires = true, ch.Expires.Add(tpmChallengeTTL)
	b, _ := json.Marshal(used)
	ok, err := s.store.SwapMeta(key, old, b)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("TPM challenge %s was already answered", id)
	}
	s.tpm.forget(id)
	if ch.Binding != hex.EncodeToString(binding[:]) {
		return fmt.Errorf("TPM challenge %s was made for another request", id)
	}
	sum := sha256.Sum256(answer)
	want, _ := hex.DecodeString(ch.Secret)
	if subtle.ConstantTimeCompare(want, sum[:]) != 1 {
		return errors.New("the TPM challenge was answered wrongly: the AK is not in the TPM that holds this EK")
	}
	return nil
}

// forget drops an open challenge answered through the store.
func (c *tpmChallenges) forget(id string) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// pruneTPMChallenges removes the stored challenges past their time:
// never answered, or answered a challenge's time ago.
func (s *Service) pruneTPMChallenges() {
	m, err := s.store.MetaPrefix(metaTPMChallengePrefix)
	if err != nil {
		return
	}
	now := s.now()
	for k, v := range m {
		var ch storedChallenge
		if json.Unmarshal(v, &ch) != nil || now.After(ch.Expires) {
			if err := s.store.DeleteMeta(k); err != nil {
				s.log.Warn("expired TPM challenge not removed from the store", "key", k, "err", err)
			}
		}
	}
}
