package gateway

import (
	"bytes"
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
)

// The gateway's long-lived keys by file name. With a database, every one
// of them lives there sealed (the shared key set); on bbolt each is a
// file in the data directory, made when first needed.
const (
	joinSigningFile     = "join-signing.key"
	workloadSigningFile = "workload-signing.key"
	joinEncryptionFile  = "join-encryption.jwk"
)

// sharedKeyFiles is the key set a fleet's gateways share: every file of
// the data directory that holds a CA, a key or a JWK. A gateway on a
// database makes them all at its first start.
var sharedKeyFiles = []string{
	"serving-ca.crt", "serving-ca.key",
	"node-ca.crt", "node-ca.key",
	joinSigningFile, joinEncryptionFile, workloadSigningFile,
	CommandKeyFile, sshCAFile, ticketSigningFile,
}

// sealedKeyVersion is the version bound into every seal: there is no key
// rotation, so every key is version 1.
const sealedKeyVersion = 1

// keyFiles is where the gateway's long-lived keys are, by file name: the
// data directory (dirKeys) or the set unsealed from the database
// (memKeys).
type keyFiles interface {
	// read returns the key's bytes, or an error matching fs.ErrNotExist.
	read(name string) ([]byte, error)
	// write stores a key made now.
	write(name string, b []byte, mode os.FileMode) error
	// where names the key for errors: a path, or the database's key.
	where(name string) string
}

// dirKeys is a data directory's key files.
type dirKeys string

func (d dirKeys) read(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(string(d), name))
}
func (d dirKeys) write(name string, b []byte, mode os.FileMode) error {
	return atomicfile.Write(filepath.Join(string(d), name), b, mode)
}
func (d dirKeys) where(name string) string { return filepath.Join(string(d), name) }

// memKeys is a key set in memory: unsealed from the database, or being
// made for it.
type memKeys map[string][]byte

func (m memKeys) read(name string) ([]byte, error) {
	if b, ok := m[name]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("%s: %w", m.where(name), fs.ErrNotExist)
}

func (m memKeys) write(name string, b []byte, _ os.FileMode) error {
	m[name] = bytes.Clone(b)
	return nil
}

func (memKeys) where(name string) string { return "the database's key " + name }

// completeKeySet makes every key of sharedKeyFiles that kf lacks.
func completeKeySet(kf keyFiles) error {
	if _, err := loadOrCreateKeys(kf, "bcgw.lab", nil); err != nil {
		return err
	}
	if _, err := loadOrCreateKey(kf, CommandKeyFile); err != nil {
		return err
	}
	if _, err := loadOrCreateKey(kf, ticketSigningFile); err != nil {
		return err
	}
	_, err := loadSSHCA(kf)
	return err
}

// errNoKEK is the start-up error of --database without a key-encryption key.
var errNoKEK = errors.New("a gateway on a database needs its key-encryption key: give --key-encryption-key FILE " +
	"(or the systemd credential bcgw-kek, LoadCredential=bcgw-kek:FILE); the gateways' keys are stored in the database sealed under it. " +
	"Make one with `bcgw kek generate --out FILE` and give every gateway of the fleet the same file")

// sharedKeys returns the fleet's key set from the database, unsealed with
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
func sharedKeys(ks store.KeyStore, k *kek.KEK, dataDir string, log *slog.Logger, beforeStore func()) (memKeys, error) {
	local, err := localKeyFiles(dataDir)
	if err != nil {
		return nil, err
	}
	fp, sealed, err := ks.Keys()
	if errors.Is(err, store.ErrNotFound) {
		if beforeStore != nil {
			beforeStore()
		}
		var set memKeys
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
	set := memKeys{}
	for _, sk := range sealed {
		b, err := k.Open(sk.Name, sk.Version, sk.Sealed)
		if err != nil {
			return nil, fmt.Errorf("the database's key %s: %w; restore the gateway_keys table from a backup", sk.Name, err)
		}
		set[sk.Name] = b
	}
	for _, name := range sharedKeyFiles {
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
func storeKeySet(ks store.KeyStore, k *kek.KEK, local memKeys, dataDir string, log *slog.Logger) (memKeys, error) {
	adopted := sortedNames(local)
	set := maps.Clone(local)
	if err := completeKeySet(set); err != nil {
		return nil, fmt.Errorf("make the key set: %w", err)
	}
	var out []store.SealedKey
	for _, name := range sharedKeyFiles {
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
func localKeyFiles(dataDir string) (memKeys, error) {
	m := memKeys{}
	for _, name := range sharedKeyFiles {
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

func sortedNames(m memKeys) []string { return slices.Sorted(maps.Keys(m)) }

// missingFrom lists the names in set that are not in names.
func missingFrom(set memKeys, names []string) []string {
	var out []string
	for _, n := range sortedNames(set) {
		if !slices.Contains(names, n) {
			out = append(out, n)
		}
	}
	return out
}
