package fleet

import (
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
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
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/store"
)

// Files of the access section under the data directory, and the kid of
// the ticket-signing key (its file is keys.TicketSigningFile).
const (
	sshSerialFile = "ssh-serial"          // the last certificate serial an earlier release issued
	TicketKID     = "bcgw-ticket-signing" // its kid in the nodes' JWKS
)

// accessKeys holds the SSH user CA and the ticket-signing key, made on
// first use.
type accessKeys struct {
	mu     sync.Mutex
	ca     ssh.Signer
	ticket *ecdsa.PrivateKey
}

func (s *Fleet) sshCA() (ssh.Signer, error) {
	s.access.mu.Lock()
	defer s.access.mu.Unlock()
	if s.access.ca != nil {
		return s.access.ca, nil
	}
	signer, err := keys.LoadSSHCA(s.keyFiles)
	if err != nil {
		return nil, err
	}
	s.access.ca = signer
	return signer, nil
}

func (s *Fleet) TicketKey() (*ecdsa.PrivateKey, error) {
	s.access.mu.Lock()
	defer s.access.mu.Unlock()
	if s.access.ticket != nil {
		return s.access.ticket, nil
	}
	k, err := keys.LoadOrCreateKey(s.keyFiles, keys.TicketSigningFile)
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
func (s *Fleet) ticketJWKS() (json.RawMessage, error) {
	k, err := s.TicketKey()
	if err != nil {
		return nil, err
	}
	return json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &k.PublicKey, KeyID: TicketKID, Algorithm: "ES256", Use: "sig"}}})
}

type accessBody struct {
	SSH        *sshspec.Spec   `json:"ssh,omitempty"`
	TicketJWKS json.RawMessage `json:"ticket_jwks,omitempty"`
}

// SSHCA makes the user CA on first use and puts it, the ticket JWKS, the
// accounts' principals and the revocations into each node's access
// section (principals and revocations added to those held).
func (s *Fleet) SSHCA(r adminapi.SSHCARequest) (adminapi.SSHCAView, error) {
	ca, err := s.sshCA()
	if err != nil {
		return adminapi.SSHCAView{}, err
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(ca.PublicKey()))) + " bcgw-user-ca"
	v := adminapi.SSHCAView{PublicKey: line}
	if len(r.Nodes) == 0 {
		return v, nil
	}
	jwks, err := s.ticketJWKS()
	if err != nil {
		return v, err
	}
	v.Generations = map[string]uint64{}
	for _, node := range r.Nodes {
		if _, err := s.NodeForSpec(node); err != nil {
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
				if p := adminapi.Principal(node, acct); !slices.Contains(a.SSH.Principals[acct], p) {
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
func (s *Fleet) nextSerial() (uint64, error) {
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
func (s *Fleet) fileSerial() (uint64, error) {
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
func (s *Fleet) SSHSign(r adminapi.SSHSignRequest) (adminapi.SSHSignView, error) {
	ttl := time.Duration(r.TTLSeconds) * time.Second
	if r.TTLSeconds == 0 {
		ttl = adminapi.DefaultCertTTL
	}
	if ttl <= 0 || ttl > adminapi.MaxCertTTL {
		return adminapi.SSHSignView{}, fmt.Errorf("ttl must be from 1s to %s", adminapi.MaxCertTTL)
	}
	if err := (sshspec.Spec{UserCA: "x", Principals: map[string][]string{"a": {r.Principal}}}).Check(); err != nil &&
		!strings.Contains(err.Error(), "user_ca") {
		return adminapi.SSHSignView{}, fmt.Errorf("principal: %w", err)
	}
	pub, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(r.PublicKey))
	if err != nil || len(strings.TrimSpace(string(rest))) > 0 {
		return adminapi.SSHSignView{}, fmt.Errorf("public key: not one authorized_keys line: %v", err)
	}
	if _, isCert := pub.(*ssh.Certificate); isCert {
		return adminapi.SSHSignView{}, errors.New("public key: a certificate, not a key")
	}
	ca, err := s.sshCA()
	if err != nil {
		return adminapi.SSHSignView{}, err
	}
	serial, err := s.nextSerial()
	if err != nil {
		return adminapi.SSHSignView{}, err
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
		return adminapi.SSHSignView{}, fmt.Errorf("signing the certificate: %w", err)
	}
	return adminapi.SSHSignView{Certificate: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert))), Serial: serial,
		ValidBefore: int64(cert.ValidBefore)}, nil
}
