//go:build linux

package helper

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"os"
	"sync"

	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/tpm"
)

// maxNodeKeys is how many node keys the helper keeps loaded: loading a
// ninth unloads the least recently used one, which the node announces
// again (tpm.nodekey) at its next use.
const maxNodeKeys = 8

// fakeSWTPMEnv names, in fakehw builds only, the swtpm (host:port of its
// TCP command port) that stands for the host's TPM, as for bcd node
// (agentcmd.FakeSWTPMEnv). A fakehw build without it has no TPM.
const fakeSWTPMEnv = "BCD_FAKEHW_SWTPM"

// errNoTPM is the host having no TPM: every tpm.* operation is refused.
var errNoTPM = errors.New(wire.NoTPM)

// openHostTPM opens the host's TPM: /dev/tpmrm0, or in a fakehw build the
// swtpm at $BCD_FAKEHW_SWTPM (openFakeTPM). buildinfo.FakeHW is a
// constant, so a host build links no TCP dialling. It answers errNoTPM
// when there is none.
func openHostTPM() (*tpm.TPM, error) {
	if buildinfo.FakeHW {
		return openFakeTPM()
	}
	return openDeviceTPM(tpm.DefaultPath)
}

// openFakeTPM opens the swtpm at $BCD_FAKEHW_SWTPM (host:port of its TCP
// command port); without it there is no TPM.
func openFakeTPM() (*tpm.TPM, error) {
	addr := os.Getenv(fakeSWTPMEnv)
	if addr == "" {
		return nil, errNoTPM
	}
	return tpm.OpenTCP(addr)
}

// openDeviceTPM opens the TPM device at path; a host without it has no TPM.
func openDeviceTPM(path string) (*tpm.TPM, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, errNoTPM
	}
	return tpm.Open(path)
}

// tpmKeys is the helper's TPM: opened at the first tpm.* operation and
// kept open, the AK, and the node keys the node announced with
// tpm.nodekey, at most maxNodeKeys, least recently used first. The node
// names a key only by its unique; the helper derives it from
// tpm.NodeKeyTemplate itself, so the node chooses no template, hierarchy,
// handle or authorization. Every operation holds mu from start to end.
type tpmKeys struct {
	mu   sync.Mutex
	t    *tpm.TPM
	ak   *tpm.Key
	held []heldKey
}

// heldKey is a node key the node announced.
type heldKey struct {
	unique [tpm.UniqueSize]byte
	key    *tpm.Key
}

// tpmOp is one tpm.* operation, run with the TPM open and k.mu held.
type tpmOp func(srv *server, k *tpmKeys, req *wire.Request) (*wire.Response, string)

func (srv *server) tpmNodeKey(_ context.Context, req *wire.Request) (*wire.Response, string) {
	return srv.withTPM(req, (*server).nodeKey)
}

func (srv *server) tpmSign(_ context.Context, req *wire.Request) (*wire.Response, string) {
	return srv.withTPM(req, (*server).sign)
}

func (srv *server) tpmAK(_ context.Context, req *wire.Request) (*wire.Response, string) {
	return srv.withTPM(req, (*server).akPublic)
}

func (srv *server) tpmCertify(_ context.Context, req *wire.Request) (*wire.Response, string) {
	return srv.withTPM(req, (*server).certify)
}

func (srv *server) tpmRelease(_ context.Context, req *wire.Request) (*wire.Response, string) {
	return srv.withTPM(req, (*server).release)
}

// withTPM opens the TPM when it is not open yet and runs op. A host
// without a TPM refuses with wire.NoTPM; a TPM that does not open fails,
// retryable.
func (srv *server) withTPM(req *wire.Request, op tpmOp) (*wire.Response, string) {
	k := &srv.tpm
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.t == nil {
		open := srv.s.openTPM
		if open == nil {
			return refused(errNoTPM)
		}
		t, err := open()
		if errors.Is(err, errNoTPM) {
			return refused(err)
		}
		if err != nil {
			return failed(fmt.Errorf("%s: %w", req.Op, err), true)
		}
		k.t = t
		srv.log.Info("helper: opened the TPM for node keys")
	}
	return op(srv, k, req)
}

// nodeKey derives the key named by the unique (unloading the least
// recently used one when maxNodeKeys are held) and answers its public
// area.
func (srv *server) nodeKey(k *tpmKeys, req *wire.Request) (*wire.Response, string) {
	u := [tpm.UniqueSize]byte(req.Unique)
	if h := k.find(u); h != nil {
		return &wire.Response{OK: true, Public: h.key.PublicArea()}, "ok"
	}
	for len(k.held) >= maxNodeKeys {
		lru := k.held[0]
		k.held = k.held[1:]
		if err := lru.key.Release(); err != nil {
			return failed(fmt.Errorf("%s: unloading the least recently used node key: %w", req.Op, err), false)
		}
		srv.log.Info("helper: unloaded the least recently used node key", "key", keyID(lru.unique[:]))
	}
	key, err := k.t.NodeKey(u)
	if err != nil {
		return failed(fmt.Errorf("%s: %w", req.Op, err), false)
	}
	k.held = append(k.held, heldKey{unique: u, key: key})
	return &wire.Response{OK: true, Public: key.PublicArea()}, "ok"
}

// sign signs the digest with a held key (ASN.1 DER ECDSA; tpm.Key checks
// the signature against the key before it answers).
func (srv *server) sign(k *tpmKeys, req *wire.Request) (*wire.Response, string) {
	h := k.find([tpm.UniqueSize]byte(req.Unique))
	if h == nil {
		return refused(fmt.Errorf("%s: %s", req.Op, wire.NotLoaded))
	}
	sig, err := h.key.Sign(nil, req.Digest, nil)
	if err != nil {
		return failed(fmt.Errorf("%s: %w", req.Op, err), false)
	}
	return &wire.Response{OK: true, Signature: sig}, "ok"
}

// akPublic answers the AK's public area.
func (srv *server) akPublic(k *tpmKeys, req *wire.Request) (*wire.Response, string) {
	ak, err := k.akKey()
	if err != nil {
		return failed(fmt.Errorf("%s: %w", req.Op, err), false)
	}
	return &wire.Response{OK: true, AKPublic: ak.PublicArea()}, "ok"
}

// certify has the AK certify a held key over the qualifying data and
// answers the TPMS_ATTEST, the AK's TPMT_SIGNATURE and the AK's public
// area (tpm.TPM.Certify verifies the certification before it answers).
func (srv *server) certify(k *tpmKeys, req *wire.Request) (*wire.Response, string) {
	h := k.find([tpm.UniqueSize]byte(req.Unique))
	if h == nil {
		return refused(fmt.Errorf("%s: %s", req.Op, wire.NotLoaded))
	}
	ak, err := k.akKey()
	if err != nil {
		return failed(fmt.Errorf("%s: %w", req.Op, err), false)
	}
	attest, sig, err := k.t.Certify(h.key, ak, [tpm.QualifyingDataSize]byte(req.QualifyingData))
	if err != nil {
		return failed(fmt.Errorf("%s: %w", req.Op, err), false)
	}
	return &wire.Response{OK: true, Attest: attest, Signature: sig, AKPublic: ak.PublicArea()}, "ok"
}

// release unloads a held key and forgets it.
func (srv *server) release(k *tpmKeys, req *wire.Request) (*wire.Response, string) {
	u := [tpm.UniqueSize]byte(req.Unique)
	for i, h := range k.held {
		if h.unique == u {
			k.held = append(k.held[:i], k.held[i+1:]...)
			if err := h.key.Release(); err != nil {
				return failed(fmt.Errorf("%s: %w", req.Op, err), false)
			}
			return ok()
		}
	}
	return refused(fmt.Errorf("%s: %s", req.Op, wire.NotLoaded))
}

// find returns the held key of u, now the most recently used, or nil.
func (k *tpmKeys) find(u [tpm.UniqueSize]byte) *heldKey {
	for i, h := range k.held {
		if h.unique == u {
			copy(k.held[i:], k.held[i+1:])
			k.held[len(k.held)-1] = h
			return &k.held[len(k.held)-1]
		}
	}
	return nil
}

func (k *tpmKeys) akKey() (*tpm.Key, error) {
	if k.ak == nil {
		ak, err := k.t.AK()
		if err != nil {
			return nil, err
		}
		k.ak = ak
	}
	return k.ak, nil
}

// close flushes every loaded key and closes the TPM.
func (k *tpmKeys) close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.t == nil {
		return nil
	}
	err := k.t.Close()
	k.t, k.ak, k.held = nil, nil, nil
	return err
}

// keyID is how the log names a node key: the first 8 bytes of its unique
// in hex (the unique is not secret: node.key records it in the clear).
func keyID(unique []byte) string {
	if len(unique) > 8 {
		unique = unique[:8]
	}
	return hex.EncodeToString(unique)
}
