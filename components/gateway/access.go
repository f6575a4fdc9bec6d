package gateway

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/base/sshspec"
	"github.com/better-compute/bcd/components/gateway/store"
)

// Files of the access section's keys under the data directory.
const (
	sshCAFile         = "ssh-user-ca.key"     // the SSH user CA (ed25519, PKCS#8 PEM)
	sshSerialFile     = "ssh-serial"          // the last certificate serial an earlier release issued
	ticketSigningFile = "ticket-signing.key"  // the exec-ticket signing key (P-256)
	ticketKID         = "bcgw-ticket-signing" // its kid in the nodes' JWKS
)

// Certificate lifetimes bcgw ssh-sign issues.
const (
	DefaultCertTTL = 15 * time.Minute
	MaxCertTTL     = 12 * time.Hour
)

// accessKeys holds the SSH user CA and the ticket-signing key, made on
// first use.
type accessKeys struct {
	mu     sync.Mutex
	ca     ssh.Signer
	ticket *ecdsa.PrivateKey
}

func (s *Server) sshCA() (ssh.Signer, error) {
	s.access.mu.Lock()
	defer s.access.mu.Unlock()
	if s.access.ca != nil {
		return s.access.ca, nil
	}
	signer, err := loadSSHCA(s.keyFiles)
	if err != nil {
		return nil, err
	}
	s.access.ca = signer
	return signer, nil
}

// loadSSHCA reads the SSH user CA (ed25519, PKCS#8 PEM), or makes and
// stores one.
func loadSSHCA(kf keyFiles) (ssh.Signer, error) {
	b, err := kf.read(sshCAFile)
	var key ed25519.PrivateKey
	switch {
	case err == nil:
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("load %s: not PEM", kf.where(sshCAFile))
		}
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		var ok bool
		if key, ok = k.(ed25519.PrivateKey); err != nil || !ok {
			return nil, fmt.Errorf("load %s: not an ed25519 key: %v", kf.where(sshCAFile), err)
		}
	case errors.Is(err, fs.ErrNotExist):
		if _, key, err = ed25519.GenerateKey(rand.Reader); err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := kf.write(sshCAFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("read %s: %w", kf.where(sshCAFile), err)
	}
	return ssh.NewSignerFromKey(key)
}

func (s *Server) ticketKey() (*ecdsa.PrivateKey, error) {
	s.access.mu.Lock()
	defer s.access.mu.Unlock()
	if s.access.ticket != nil {
		return s.access.ticket, nil
	}
	k, err := loadOrCreateKey(s.keyFiles, ticketSigningFile)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("the ticket-signing key is not ECDSA")
	}
	s.access.ticket = ek
	return ek, nil
}

// ticketJWKS is the JWKS nodes verify exec tickets with.
func (s *Server) ticketJWKS() (json.RawMessage, error) {
	k, err := s.ticketKey()
	if err != nil {
		return nil, err
	}
	return json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &k.PublicKey, KeyID: ticketKID, Algorithm: "ES256", Use: "sig"}}})
}

// SSHCARequest is `bcgw ssh-ca`: the nodes whose access section gets the
// user CA and the ticket JWKS, the local accounts given principals there
// (NODE:ACCOUNT each, bound to the node), and serials to revoke.
type SSHCARequest struct {
	Nodes    []string `json:"nodes,omitempty"`
	Accounts []string `json:"accounts,omitempty"`
	Revoke   []uint64 `json:"revoke,omitempty"`
	// JWKSOnly puts only the exec-ticket JWKS (tunnels to TCP ports and
	// consoles on a node without sshd).
	JWKSOnly bool `json:"jwks_only,omitempty"`
}

// SSHCAView is the answer: the CA's public key and each node's new
// generation.
type SSHCAView struct {
	PublicKey   string            `json:"public_key"`
	Generations map[string]uint64 `json:"generations,omitempty"`
}

// Principal is the principal a node's account accepts: NODE:ACCOUNT, so a
// certificate for one node opens no other.
func Principal(node, account string) string { return node + ":" + account }

type accessBody struct {
	SSH        *sshspec.Spec   `json:"ssh,omitempty"`
	TicketJWKS json.RawMessage `json:"ticket_jwks,omitempty"`
}

// SSHCA makes the user CA on first use and puts it, the ticket JWKS, the
// accounts' principals and the revocations into each node's access
// section (principals and revocations added to those held).
func (s *Server) SSHCA(r SSHCARequest) (SSHCAView, error) {
	ca, err := s.sshCA()
	if err != nil {
		return SSHCAView{}, err
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(ca.PublicKey()))) + " bcgw-user-ca"
	v := SSHCAView{PublicKey: line}
	if len(r.Nodes) == 0 {
		return v, nil
	}
	jwks, err := s.ticketJWKS()
	if err != nil {
		return v, err
	}
	v.Generations = map[string]uint64{}
	for _, node := range r.Nodes {
		if _, err := s.nodeForSpec(node); err != nil {
			return v, err
		}
		gen, err := s.changeSpec(node, func(cur nodespec.Spec) (nodespec.Spec, []byte, error) {
			var a accessBody
			if b, ok := cur["access"]; ok {
				if err := json.Unmarshal(b, &a); err != nil {
					return nil, nil, fmt.Errorf("the access section of %s: %w", node, err)
				}
			}
			if r.JWKSOnly {
				a.TicketJWKS = jwks
				p, err := json.Marshal(map[string]accessBody{"access": a})
				if err != nil {
					return nil, nil, err
				}
				next, err := nodespec.Merge(cur.Encode(), p)
				return next, p, err
			}
			if a.SSH == nil {
				a.SSH = &sshspec.Spec{}
			}
			a.SSH.UserCA = line
			for _, acct := range r.Accounts {
				if a.SSH.Principals == nil {
					a.SSH.Principals = map[string][]string{}
				}
				if p := Principal(node, acct); !slices.Contains(a.SSH.Principals[acct], p) {
					a.SSH.Principals[acct] = append(a.SSH.Principals[acct], p)
				}
			}
			for _, n := range r.Revoke {
				if !slices.Contains(a.SSH.RevokedSerials, n) {
					a.SSH.RevokedSerials = append(a.SSH.RevokedSerials, n)
				}
			}
			if err := a.SSH.Check(); err != nil {
				return nil, nil, err
			}
			a.TicketJWKS = jwks
			p, err := json.Marshal(map[string]accessBody{"access": a})
			if err != nil {
				return nil, nil, err
			}
			next, err := nodespec.Merge(cur.Encode(), p)
			if err != nil {
				return nil, nil, err
			}
			return next, p, nil
		})
		if err != nil {
			return v, err
		}
		v.Generations[node] = gen
	}
	return v, nil
}

// SSHSignRequest is `bcgw ssh-sign`.
type SSHSignRequest struct {
	Principal  string `json:"principal"`
	PublicKey  string `json:"public_key"` // authorized_keys form
	TTLSeconds int64  `json:"ttl_seconds,omitempty"`
}

// SSHSignView is the certificate (authorized_keys form) and its serial.
type SSHSignView struct {
	Certificate string `json:"certificate"`
	Serial      uint64 `json:"serial"`
	ValidBefore int64  `json:"valid_before"`
}

// metaSSHSerial is the last SSH certificate serial issued, in the store,
// so gateways sharing a database never issue one serial twice (a serial
// is what the KRL revokes).
const metaSSHSerial = "ssh/serial"

// nextSerial takes the next certificate serial: a compare-and-swap on the
// stored one, tried again when another gateway took it first. A gateway
// of an earlier release counted from 1 in its own data directory
// (ssh-serial), so the first serial a database holds is the time in
// seconds times 2^20: above any count a gateway of a fleet reached before,
// whichever gateway issues first. The next serial is past this gateway's
// own count as well.
func (s *Server) nextSerial() (uint64, error) {
	legacy, err := s.fileSerial()
	if err != nil {
		return 0, err
	}
	var n uint64
	err = store.UpdateMeta(s.store, metaSSHSerial, 32, func(old []byte) ([]byte, error) {
		var perr error
		if len(old) == 0 {
			n = uint64(s.now().Unix()) << 20
		} else if n, perr = strconv.ParseUint(string(old), 10, 64); perr != nil {
			return nil, fmt.Errorf("the stored SSH certificate serial %q: %w", old, perr)
		}
		n = max(n, legacy) + 1
		return []byte(strconv.FormatUint(n, 10)), nil
	})
	if err != nil {
		return 0, fmt.Errorf("SSH certificate serial: %w", err)
	}
	return n, nil
}

// fileSerial is the serial count an earlier release kept in the data
// directory (0 without one).
func (s *Server) fileSerial() (uint64, error) {
	p := filepath.Join(s.cfg.DataDir, sshSerialFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return n, nil
}

// SSHSign issues a short-lived user certificate for one principal, with a
// serial of its own (revocable in the KRL) and the key id
// "bcgw:<principal>:<serial>".
func (s *Server) SSHSign(r SSHSignRequest) (SSHSignView, error) {
	ttl := time.Duration(r.TTLSeconds) * time.Second
	if r.TTLSeconds == 0 {
		ttl = DefaultCertTTL
	}
	if ttl <= 0 || ttl > MaxCertTTL {
		return SSHSignView{}, fmt.Errorf("ttl must be from 1s to %s", MaxCertTTL)
	}
	if err := (sshspec.Spec{UserCA: "x", Principals: map[string][]string{"a": {r.Principal}}}).Check(); err != nil &&
		!strings.Contains(err.Error(), "user_ca") {
		return SSHSignView{}, fmt.Errorf("principal: %w", err)
	}
	pub, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(r.PublicKey))
	if err != nil || len(strings.TrimSpace(string(rest))) > 0 {
		return SSHSignView{}, fmt.Errorf("public key: not one authorized_keys line: %v", err)
	}
	if _, isCert := pub.(*ssh.Certificate); isCert {
		return SSHSignView{}, errors.New("public key: a certificate, not a key")
	}
	ca, err := s.sshCA()
	if err != nil {
		return SSHSignView{}, err
	}
	serial, err := s.nextSerial()
	if err != nil {
		return SSHSignView{}, err
	}
	now := s.now()
	cert := &ssh.Certificate{
		Key: pub, Serial: serial, CertType: ssh.UserCert,
		KeyId:           fmt.Sprintf("bcgw:%s:%d", r.Principal, serial),
		ValidPrincipals: []string{r.Principal},
		ValidAfter:      uint64(now.Add(-time.Minute).Unix()),
		ValidBefore:     uint64(now.Add(ttl).Unix()),
		Permissions:     ssh.Permissions{Extensions: map[string]string{"permit-pty": ""}},
	}
	if err := cert.SignCert(rand.Reader, ca); err != nil {
		return SSHSignView{}, fmt.Errorf("signing the certificate: %w", err)
	}
	return SSHSignView{Certificate: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert))), Serial: serial,
		ValidBefore: int64(cert.ValidBefore)}, nil
}

func (s *Server) adminSSHCA(w http.ResponseWriter, r *http.Request) {
	var req SSHCARequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	v, err := s.SSHCA(req)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, v)
}

func (s *Server) adminSSHSign(w http.ResponseWriter, r *http.Request) {
	var req SSHSignRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	v, err := s.SSHSign(req)
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, v)
}
