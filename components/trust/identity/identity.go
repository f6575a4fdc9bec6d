// Package identity stores an agent's joined identity under its data
// directory: node.key (a PKCS#8 PEM key, or the record of a key held in the
// host's TPM; 0600) and identity.json (who the gateway says this agent is,
// and its current certificate).
package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/trust/pki"
)

// File names under the data directory.
const (
	KeyFile      = "node.key"
	IdentityFile = "identity.json"
)

// ErrNotJoined is returned by Load when the data directory holds no identity.
var ErrNotJoined = errors.New("this node has not joined (run bcd join)")

// Identity is what identity.json records.
type Identity struct {
	NodeID         string    `json:"node_id"`
	Site           string    `json:"site"`
	Role           string    `json:"role"`
	SPIFFEID       string    `json:"spiffe_id"`
	CertificatePEM string    `json:"certificate_pem"`
	NotAfter       time.Time `json:"not_after"`
	JoinedAt       time.Time `json:"joined_at"`
}

// Agent is a loaded identity with its key and parsed certificate.
type Agent struct {
	Identity
	Key  crypto.Signer
	Cert *x509.Certificate
	// KeyHolder is what holds the node key: KeyInFile or KeyInTPM.
	KeyHolder string
}

// TLSCertificate returns the certificate and key for mTLS.
func (a *Agent) TLSCertificate() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{a.Cert.Raw}, PrivateKey: a.Key, Leaf: a.Cert}
}

// Load reads identity.json and node.key from dir and checks that they
// belong together. A directory with neither returns ErrNotJoined.
//
// A key in the TPM is not derived: Agent.Key answers its public half, and
// signing with it fails. Use LoadWith to sign.
func Load(dir string) (*Agent, error) { return LoadWith(dir, nil) }

// LoadWith is Load with the host's TPM, which derives a node.key held in it
// (and checks that it is the key node.key and the certificate name). tpm may
// be nil when node.key is a file.
func LoadWith(dir string, tpm TPM) (*Agent, error) {
	idPath := filepath.Join(dir, IdentityFile)
	raw, err := os.ReadFile(idPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotJoined
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", idPath, err)
	}
	var id Identity
	if err := json.Unmarshal(raw, &id); err != nil {
		return nil, fmt.Errorf("parse %s: %w", idPath, err)
	}
	keyPath := filepath.Join(dir, KeyFile)
	blk, _ := pem.Decode([]byte(id.CertificatePEM))
	if blk == nil {
		return nil, fmt.Errorf("%s: no certificate", idPath)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: certificate: %w", idPath, err)
	}
	key, err := readKey(keyPath)
	if err != nil {
		return nil, err
	}
	if !samePublicKey(cert.PublicKey, key.public()) {
		// Save died between writing identity.json and moving node.key.next
		// into place: finish its work.
		next := keyPath + ".next"
		nk, nerr := readKey(next)
		if nerr != nil || !samePublicKey(cert.PublicKey, nk.public()) {
			return nil, fmt.Errorf("%s: certificate is not for %s", idPath, keyPath)
		}
		if err := os.Rename(next, keyPath); err != nil {
			return nil, fmt.Errorf("complete key swap: rename %s: %w", next, err)
		}
		syncDir(dir)
		key = nk
	}
	if id.NodeID == "" || id.Role == "" {
		return nil, fmt.Errorf("%s: node_id and role are required", idPath)
	}
	signer, err := key.signer(keyPath, tpm)
	if err != nil {
		return nil, err
	}
	return &Agent{Identity: id, Key: signer, Cert: cert, KeyHolder: key.holder()}, nil
}

// Save writes node.key (0600) and identity.json (0600) so that a crash at
// any point leaves an identity that loads: the new key goes to
// node.key.next, then identity.json names the new certificate, then
// node.key.next is renamed over node.key (Load finishes that last step if
// the process died before it). A key in the TPM (a TPMKey) is recorded by
// its unique and public key; any other key is written as PKCS#8.
func Save(dir string, key crypto.Signer, cert *x509.Certificate, id Identity) (*Agent, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("mkdir %s: %w", dir, err)
	}
	if !samePublicKey(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("save identity: the certificate is not for this key")
	}
	holder := KeyInFile
	var kb []byte
	var err error
	if tk, ok := key.(TPMKey); ok {
		holder = KeyInTPM
		kb, err = marshalTPMRecord(tk)
	} else {
		kb, err = pki.MarshalPrivateKeyPEM(key)
	}
	if err != nil {
		return nil, err
	}
	id.CertificatePEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))
	id.NotAfter = cert.NotAfter.UTC()
	jb, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode identity: %w", err)
	}
	keyPath := filepath.Join(dir, KeyFile)
	if err := WriteFileAtomic(keyPath+".next", kb, 0o600); err != nil {
		return nil, err
	}
	if err := WriteFileAtomic(filepath.Join(dir, IdentityFile), append(jb, '\n'), 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(keyPath+".next", keyPath); err != nil {
		return nil, fmt.Errorf("rename %s.next: %w", keyPath, err)
	}
	syncDir(dir)
	return &Agent{Identity: id, Key: key, Cert: cert, KeyHolder: holder}, nil
}

// WriteFileAtomic replaces path with data at mode, crash-safely.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	return atomicfile.Write(path, data, mode)
}

func syncDir(dir string) { atomicfile.SyncDir(dir) }

// storedKey is what node.key holds: a private key, or a TPM key's record.
type storedKey struct {
	file crypto.Signer
	tpm  *tpmRecord
}

func (k storedKey) public() crypto.PublicKey {
	if k.tpm != nil {
		return k.tpm.pub
	}
	return k.file.Public()
}

func (k storedKey) holder() string {
	if k.tpm != nil {
		return KeyInTPM
	}
	return KeyInFile
}

// signer returns the key to sign with: the file's, or the TPM's derived
// from the record's unique and checked against its public key.
func (k storedKey) signer(path string, t TPM) (crypto.Signer, error) {
	if k.tpm == nil {
		return k.file, nil
	}
	if t == nil {
		return absentTPMKey{pub: k.tpm.pub}, nil
	}
	s, err := t.NodeKey(k.tpm.unique)
	if err != nil {
		return nil, fmt.Errorf("%s: derive the node key in the TPM: %w", path, err)
	}
	if !samePublicKey(s.Public(), k.tpm.pub) {
		return nil, fmt.Errorf("%s: the TPM derives another key for this unique than node.key records (was the TPM cleared?); join again: bcd join --reset --yes", path)
	}
	return s, nil
}

func readKey(path string) (storedKey, error) {
	kb, err := os.ReadFile(path)
	if err != nil {
		return storedKey{}, fmt.Errorf("read %s: %w", path, err)
	}
	if isTPMRecord(kb) {
		r, err := parseTPMRecord(kb)
		if err != nil {
			return storedKey{}, fmt.Errorf("parse %s: %w", path, err)
		}
		return storedKey{tpm: r}, nil
	}
	key, err := pki.ParsePrivateKeyPEM(kb)
	if err != nil {
		return storedKey{}, fmt.Errorf("parse %s: %w", path, err)
	}
	return storedKey{file: key}, nil
}

// Reset moves identity.json, node.key, node.key.next and the journal
// (its directory, and the bbolt journal.db of older releases) aside
// (to NAME.reset-UNIXTIME) and returns what it moved.
func Reset(dir string, now time.Time) ([]string, error) {
	var moved []string
	for _, n := range []string{IdentityFile, KeyFile, KeyFile + ".next", "journal", "journal.db"} {
		p := filepath.Join(dir, n)
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		dst := fmt.Sprintf("%s.reset-%d", p, now.Unix())
		if err := os.Rename(p, dst); err != nil {
			return moved, fmt.Errorf("rename %s: %w", p, err)
		}
		moved = append(moved, p)
	}
	return moved, nil
}

// ResetCandidates lists the files Reset would move.
func ResetCandidates(dir string) []string {
	var out []string
	for _, n := range []string{IdentityFile, KeyFile, KeyFile + ".next", "journal", "journal.db"} {
		p := filepath.Join(dir, n)
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func samePublicKey(a, b crypto.PublicKey) bool {
	ea, ok1 := a.(*ecdsa.PublicKey)
	eb, ok2 := b.(*ecdsa.PublicKey)
	return ok1 && ok2 && ea.Equal(eb)
}
