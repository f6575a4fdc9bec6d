package keys

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/store"
	"golang.org/x/crypto/ssh"
)

// The gateway's long-lived keys by file name. With a database, every one
// of them lives there sealed (the shared key set); on bbolt each is a
// file in the data directory, made when first needed.
const (
	SSHCAFile           = "ssh-user-ca.key"    // the SSH user CA (ed25519, PKCS#8 PEM)
	TicketSigningFile   = "ticket-signing.key" // the exec-ticket signing key (P-256)
	joinSigningFile     = "join-signing.key"
	workloadSigningFile = "workload-signing.key"
	joinEncryptionFile  = "join-encryption.jwk"
)

// SharedFiles is the key set a fleet's gateways share: every file of
// the data directory that holds a CA, a key or a JWK. A gateway on a
// database makes them all at its first start.
var SharedFiles = []string{
	"serving-ca.crt", "serving-ca.key",
	"node-ca.crt", "node-ca.key",
	joinSigningFile, joinEncryptionFile, workloadSigningFile,
	CommandKeyFile, SSHCAFile, TicketSigningFile,
}

// sealedKeyVersion is the version bound into every key's seal when the
// set is made; a rotation of a key (rotate.go) stores it one more.
const sealedKeyVersion = 1

// Files is where the gateway's long-lived keys are, by file name: the
// data directory (Dir) or the set unsealed from the database
// (Mem).
type Files interface {
	// Read returns the key's bytes, or an error matching fs.ErrNotExist.
	Read(name string) ([]byte, error)
	// Write stores a key made now.
	Write(name string, b []byte, mode os.FileMode) error
	// Where names the key for errors: a path, or the database's key.
	Where(name string) string
}

// Dir is a data directory's key files.
type Dir string

func (d Dir) Read(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(string(d), name))
}
func (d Dir) Write(name string, b []byte, mode os.FileMode) error {
	return atomicfile.Write(filepath.Join(string(d), name), b, mode)
}
func (d Dir) Where(name string) string { return filepath.Join(string(d), name) }

// Mem is a key set in memory: unsealed from the database, or being
// made for it.
type Mem map[string][]byte

func (m Mem) Read(name string) ([]byte, error) {
	if b, ok := m[name]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("%s: %w", m.Where(name), fs.ErrNotExist)
}

func (m Mem) Write(name string, b []byte, _ os.FileMode) error {
	m[name] = bytes.Clone(b)
	return nil
}

func (Mem) Where(name string) string { return "the database's key " + name }

// completeKeySet makes every key of SharedFiles that kf lacks.
func completeKeySet(kf Files) error {
	if _, err := LoadOrCreate(kf, "bcgw.lab", nil); err != nil {
		return err
	}
	if _, err := LoadOrCreateKey(kf, CommandKeyFile); err != nil {
		return err
	}
	if _, err := LoadOrCreateKey(kf, TicketSigningFile); err != nil {
		return err
	}
	_, err := LoadSSHCA(kf)
	return err
}

// ErrNoKEK is the start-up error of --database without a key-encryption key.
var ErrNoKEK = errors.New("a gateway on a database needs its key-encryption key: give --key-encryption-key FILE " +
	"(or the systemd credential bcgw-kek, LoadCredential=bcgw-kek:FILE); the gateways' keys are stored in the database sealed under it. " +
	"Make one with `bcgw kek generate --out FILE` and give every gateway of the fleet the same file")

// Shared returns the fleet's key set from the database, unsealed with
// k. On an empty database it stores one first: the key files of the data
// directory when it has any (adoption: agents' pins stay valid), with
// what they lack made anew, or a new set; of gateways starting together
// one set is stored and each reads that one back. The data directory's
// key files are then no longer used: when they are the same as the
// database's the log names them as removable; when one differs the start
// is refused (never one picked silently).
//
// beforeStore, when set, runs once the database was found without keys,
// before this gateway offers its set (tests: gateways meet there).
func Shared(ks store.KeyStore, k *kek.KEK, dataDir string, log *slog.Logger, beforeStore func()) (Mem, error) {
	local, err := localKeyFiles(dataDir)
	if err != nil {
		return nil, err
	}
	fp, sealed, err := ks.Keys()
	if errors.Is(err, store.ErrNotFound) {
		if beforeStore != nil {
			beforeStore()
		}
		var set Mem
		if set, err = storeKeySet(ks, k, local, dataDir, log); err == nil && set == nil {
			// Another gateway stored its set first: read that one.
			fp, sealed, err = ks.Keys()
		}
		if set != nil {
			return set, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read the key set: %w", err)
	}
	if fp != k.Fingerprint() {
		return nil, fmt.Errorf("the database's keys are sealed under key-encryption key %s; this gateway was given %s: give it the same file as the other gateways",
			fp, k.Fingerprint())
	}
	set := Mem{}
	for _, sk := range sealed {
		b, err := k.Open(sk.Name, sk.Version, sk.Sealed)
		if err != nil {
			return nil, fmt.Errorf("the database's key %s: %w; restore the gateway_keys table from a backup", sk.Name, err)
		}
		set[sk.Name] = b
	}
	for _, name := range SharedFiles {
		if _, ok := set[name]; !ok {
			return nil, fmt.Errorf("the database's key set lacks %s; restore the gateway_keys table from a backup", name)
		}
	}
	for _, name := range sortedNames(local) {
		if !bytes.Equal(local[name], set[name]) {
			return nil, fmt.Errorf("%s differs from the key %s the database holds for the fleet; "+
				"this gateway would serve other keys than the others: move the data directory's key files (%s) aside, "+
				"or start it on the database its keys belong to",
				filepath.Join(dataDir, name), name, strings.Join(sortedNames(local), ", "))
		}
	}
	if len(local) > 0 {
		log.Info("the keys are in the database; the data directory's key files are the same and no longer used, and may be removed",
			"data_dir", dataDir, "removable", sortedNames(local))
	}
	log.Info("keys read from the database", "kek", k.Fingerprint(), "keys", len(set))
	return set, nil
}

// storeKeySet stores the data directory's key files (local), with the
// keys they lack made anew, as the database's key set when the database
// has none, and returns that set; nil when another set was there first.
func storeKeySet(ks store.KeyStore, k *kek.KEK, local Mem, dataDir string, log *slog.Logger) (Mem, error) {
	adopted := sortedNames(local)
	set := maps.Clone(local)
	if err := completeKeySet(set); err != nil {
		return nil, fmt.Errorf("make the key set: %w", err)
	}
	var out []store.SealedKey
	for _, name := range SharedFiles {
		b, err := k.Seal(name, sealedKeyVersion, set[name])
		if err != nil {
			return nil, err
		}
		out = append(out, store.SealedKey{Name: name, Version: sealedKeyVersion, Sealed: b})
	}
	added, err := ks.AddKeysIfAbsent(k.Fingerprint(), out)
	if err != nil || !added {
		return nil, err
	}
	if len(adopted) > 0 {
		log.Warn("adopted the data directory's key files into the database, sealed under the key-encryption key; "+
			"the gateway no longer uses them and they may be removed",
			"kek", k.Fingerprint(), "data_dir", dataDir, "adopted", adopted, "made", missingFrom(set, adopted),
			"removable", adopted)
	} else {
		log.Info("made the gateway's keys and stored them in the database, sealed under the key-encryption key",
			"kek", k.Fingerprint(), "keys", len(out))
	}
	return set, nil
}

// localKeyFiles reads the shared key files the data directory holds.
func localKeyFiles(dataDir string) (Mem, error) {
	m := Mem{}
	for _, name := range SharedFiles {
		b, err := os.ReadFile(filepath.Join(dataDir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", filepath.Join(dataDir, name), err)
		}
		m[name] = b
	}
	return m, nil
}

func sortedNames(m Mem) []string { return slices.Sorted(maps.Keys(m)) }

// missingFrom lists the names in set that are not in names.
func missingFrom(set Mem, names []string) []string {
	var out []string
	for _, n := range sortedNames(set) {
		if !slices.Contains(names, n) {
			out = append(out, n)
		}
	}
	return out
}

// CommandKeyFile is bcgw's own command-signing key under the data
// directory, made at first start unless Config.CommandKey says otherwise.
const CommandKeyFile = "command-signing.key"

// LoadSSHCA reads the SSH user CA (ed25519, PKCS#8 PEM), or makes and
// stores one.
func LoadSSHCA(kf Files) (ssh.Signer, error) {
	b, err := kf.Read(SSHCAFile)
	var key ed25519.PrivateKey
	switch {
	case err == nil:
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("load %s: not PEM", kf.Where(SSHCAFile))
		}
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		var ok bool
		if key, ok = k.(ed25519.PrivateKey); err != nil || !ok {
			return nil, fmt.Errorf("load %s: not an ed25519 key: %v", kf.Where(SSHCAFile), err)
		}
	case errors.Is(err, fs.ErrNotExist):
		if _, key, err = ed25519.GenerateKey(rand.Reader); err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := kf.Write(SSHCAFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("read %s: %w", kf.Where(SSHCAFile), err)
	}
	return ssh.NewSignerFromKey(key)
}
