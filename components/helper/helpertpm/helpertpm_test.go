package helpertpm_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/better-compute/bcd/components/agent/renew"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/helpertpm"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

// helpertpm stands in for the TPM of renewal and the identity.
var _ renew.TPM = (*helpertpm.TPM)(nil)

// fakeHelper answers tpm.* on a unix socket from a real swtpm, honestly
// unless forge changes the answer. Like bcd helper, it holds only the keys
// tpm.nodekey announced and refuses the others with wire.NotLoaded.
type fakeHelper struct {
	t     *tpm.TPM
	mu    sync.Mutex
	held  map[[32]byte]*tpm.Key
	calls []string
	forge forger
}

// forger changes a successful answer; it may use the fake's own TPM
// (f.t), so it must not call f's locking methods.
type forger func(f *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response

func startFake(t *testing.T, forge forger) (*fakeHelper, *helpertpm.TPM) {
	t.Helper()
	tp, err := tpm.OpenTCP(swtpmtest.Start(t, "").Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	f := &fakeHelper{t: tp, held: map[[32]byte]*tpm.Key{}, forge: forge}
	sock := filepath.Join(t.TempDir(), "helper.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f, helpertpm.New(&helperclient.Client{Socket: sock})
}

func (f *fakeHelper) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	data, _ := io.ReadAll(io.LimitReader(c, wire.MaxRequest))
	req, err := wire.DecodeRequest(data)
	if err == nil {
		err = req.Check()
	}
	var resp *wire.Response
	if err != nil {
		resp = wire.Failed(err.Error(), false)
	} else {
		resp = f.answer(req)
		if f.forge != nil && resp.OK {
			resp = f.forge(f, req, resp)
		}
	}
	c.Write(wire.EncodeResponse(resp))
}

func (f *fakeHelper) answer(req *wire.Request) *wire.Response {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, req.Op)
	fail := func(err error) *wire.Response { return wire.Failed(req.Op+": "+err.Error(), false) }
	u := [32]byte(append(req.Unique, make([]byte, 32)...)[:32])
	k := f.held[u]
	if k == nil && req.Op != wire.OpTPMNodeKey && req.Op != wire.OpTPMAK {
		return fail(errors.New(wire.NotLoaded))
	}
	switch req.Op {
	case wire.OpTPMNodeKey:
		k, err := f.t.NodeKey(u)
		if err != nil {
			return fail(err)
		}
		f.held[u] = k
		return &wire.Response{OK: true, Public: k.PublicArea()}
	case wire.OpTPMSign:
		sig, err := k.Sign(nil, req.Digest, nil)
		if err != nil {
			return fail(err)
		}
		return &wire.Response{OK: true, Signature: sig}
	case wire.OpTPMAK:
		ak, err := f.t.AK()
		if err != nil {
			return fail(err)
		}
		return &wire.Response{OK: true, AKPublic: ak.PublicArea()}
	case wire.OpTPMCertify:
		ak, err := f.t.AK()
		if err != nil {
			return fail(err)
		}
		attest, sig, err := f.t.Certify(k, ak, [32]byte(req.QualifyingData))
		if err != nil {
			return fail(err)
		}
		return &wire.Response{OK: true, Attest: attest, Signature: sig, AKPublic: ak.PublicArea()}
	case wire.OpTPMRelease:
		delete(f.held, u)
		return &wire.Response{OK: true}
	}
	return fail(errors.New("unknown operation"))
}

// forget drops every held key, as a helper restart does.
func (f *fakeHelper) forget() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = map[[32]byte]*tpm.Key{}
}

func (f *fakeHelper) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func TestThroughTheHelper(t *testing.T) {
	f, h := startFake(t, nil)
	k, err := h.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	key := k.(*helpertpm.Key)
	again, err := h.NodeKey(key.TPMUnique())
	if err != nil || !again.Public().(*ecdsa.PublicKey).Equal(k.Public()) {
		t.Fatalf("the same unique derived another key: %v", err)
	}
	for _, d := range [][]byte{sum256("a"), sum384("b"), sum512("c")} {
		sig, err := k.Sign(nil, d, nil)
		if err != nil || !ecdsa.VerifyASN1(k.Public().(*ecdsa.PublicKey), d, sig) {
			t.Fatalf("Sign(%d bytes): %v", len(d), err)
		}
	}
	// pki's framed signatures and a CSR, as join and renewal make them.
	sig, err := pki.Sign(k, "bcd test", []byte("msg"))
	if err != nil || pki.Verify(k.Public(), "bcd test", []byte("msg"), sig) != nil {
		t.Fatalf("pki.Sign through the helper: %v", err)
	}
	csr, err := pki.CreateCSR(k, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.ParseCSR(csr); err != nil {
		t.Fatal(err)
	}
	qd := [32]byte(sum256(string(csr)))
	keyPub, attest, csig, err := h.Certify(k, qd)
	if err != nil {
		t.Fatal(err)
	}
	akPub, err := h.AKPublic()
	if err != nil {
		t.Fatal(err)
	}
	if err := tpm.VerifyCertify(akPub, attest, csig, keyPub, qd); err != nil {
		t.Fatalf("the certification does not verify: %v", err)
	}

	// The helper forgot the key (restarted, unloaded it, released): the node
	// announces it again with tpm.nodekey and retries.
	f.takeCalls()
	f.forget()
	if _, err := k.Sign(nil, sum256("x"), nil); err != nil {
		t.Fatalf("Sign after the helper forgot the key: %v", err)
	}
	if got := strings.Join(f.takeCalls(), " "); got != "tpm.sign tpm.nodekey tpm.sign" {
		t.Errorf("calls = %s", got)
	}
	if err := key.Release(); err != nil {
		t.Fatal(err)
	}
	if err := key.Release(); err != nil {
		t.Fatalf("a second Release: %v", err)
	}
	if _, _, _, err := h.Certify(k, qd); err != nil {
		t.Fatalf("Certify after Release: %v", err)
	}

	// Refused before anything is sent.
	f.takeCalls()
	file, _ := pki.GenerateKey()
	for name, call := range map[string]func() error{
		"a 20-byte digest":    func() error { _, err := k.Sign(nil, make([]byte, 20), nil); return err },
		"an unhashed message": func() error { _, err := k.Sign(nil, make([]byte, 32), crypto.Hash(0)); return err },
		"SHA-384 opts, 32 bytes": func() error {
			_, err := k.Sign(nil, make([]byte, 32), crypto.SHA384)
			return err
		},
		"certify a file key": func() error { _, _, _, err := h.Certify(file, qd); return err },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if c := f.takeCalls(); len(c) != 0 {
		t.Errorf("refused calls reached the helper: %v", c)
	}
}

func TestNoTPM(t *testing.T) {
	_, h := startFake(t, func(_ *fakeHelper, _ *wire.Request, _ *wire.Response) *wire.Response {
		return wire.Failed(wire.NoTPM, false)
	})
	if _, err := h.NewNodeKey(); !helperclient.IsNoTPM(err) || !strings.Contains(err.Error(), "the host has no TPM") {
		t.Fatalf("NewNodeKey: %v", err)
	}
	if _, err := h.AKPublic(); !helperclient.IsNoTPM(err) {
		t.Fatalf("AKPublic: %v", err)
	}
}

// TestForgedAnswers: every answer of a helper that lies is refused.
func TestForgedAnswers(t *testing.T) {
	other, err := tpm.OpenTCP(swtpmtest.Start(t, "").Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	otherAK, err := other.AK()
	if err != nil {
		t.Fatal(err)
	}
	// another's key and certification of the same unique by the other
	// TPM's AK.
	otherKey := func(req *wire.Request) *tpm.Key {
		k, err := other.NodeKey([32]byte(req.Unique))
		if err != nil {
			t.Error(err)
		}
		return k
	}

	tests := []struct {
		name  string
		forge forger
		call  func(h *helpertpm.TPM) error
		want  string
	}{
		{
			name: "public area with other attributes",
			forge: func(_ *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMNodeKey {
					p, err := tpm2.Unmarshal[tpm2.TPMTPublic](resp.Public)
					if err != nil {
						t.Error(err)
						return resp
					}
					p.ObjectAttributes.FixedTPM = false // a key that may leave the TPM
					resp.Public = tpm2.Marshal(p)
				}
				return resp
			},
			call: func(h *helpertpm.TPM) error { _, err := h.NewNodeKey(); return err },
			want: "tpm.nodekey answered a public area that is not a bcd node key",
		},
		{
			name: "the AK as the node key",
			forge: func(_ *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMNodeKey {
					resp.Public = otherAK.PublicArea()
				}
				return resp
			},
			call: func(h *helpertpm.TPM) error { _, err := h.NewNodeKey(); return err },
			want: "not a bcd node key",
		},
		{
			name: "a node key as the AK",
			forge: func(_ *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMAK {
					resp.AKPublic = otherKey(&wire.Request{Unique: make([]byte, 32)}).PublicArea()
				}
				return resp
			},
			call: func(h *helpertpm.TPM) error { _, err := h.AKPublic(); return err },
			want: "tpm.ak answered a public area that is not a bcd AK",
		},
		{
			name: "a signature by another key",
			forge: func(_ *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMSign {
					sig, err := otherKey(req).Sign(nil, req.Digest, nil)
					if err != nil {
						t.Error(err)
					}
					resp.Signature = sig
				}
				return resp
			},
			call: func(h *helpertpm.TPM) error { return sign(h) },
			want: "tpm.sign answered a signature that does not verify against the node key",
		},
		{
			name: "a signature over another digest",
			forge: func(_ *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMSign {
					resp = &wire.Response{OK: true, Signature: bytes.Clone(resp.Signature)}
					resp.Signature[len(resp.Signature)-1] ^= 1
				}
				return resp
			},
			call: func(h *helpertpm.TPM) error { return sign(h) },
			want: "does not verify against the node key",
		},
		{
			name: "a certification by another AK announced in the answer",
			forge: func(_ *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMCertify {
					attest, sig, err := other.Certify(otherKey(req), otherAK, [32]byte(req.QualifyingData))
					if err != nil {
						t.Error(err)
					}
					return &wire.Response{OK: true, Attest: attest, Signature: sig, AKPublic: otherAK.PublicArea()}
				}
				return resp
			},
			call: certify,
			want: "a certification by another AK than the one it announced",
		},
		{
			name: "a certification by another AK under the announced one's name",
			forge: func(_ *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMCertify {
					attest, sig, err := other.Certify(otherKey(req), otherAK, [32]byte(req.QualifyingData))
					if err != nil {
						t.Error(err)
					}
					resp.Attest, resp.Signature = attest, sig
				}
				return resp
			},
			call: certify,
			want: "does not verify: verify certification: the AK's signature does not match the attestation",
		},
		{
			name: "a certification over other qualifying data",
			forge: func(f *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMCertify {
					k, _ := f.t.NodeKey([32]byte(req.Unique))
					ak, _ := f.t.AK()
					attest, sig, err := f.t.Certify(k, ak, [32]byte{9})
					if err != nil {
						t.Error(err)
					}
					resp.Attest, resp.Signature = attest, sig
				}
				return resp
			},
			call: certify,
			want: "does not verify: verify certification: the attestation carries other qualifying data",
		},
		{
			name: "a certification of another key of the same TPM",
			forge: func(f *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMCertify {
					k, _ := f.t.NodeKey([32]byte{42})
					ak, _ := f.t.AK()
					attest, sig, err := f.t.Certify(k, ak, [32]byte(req.QualifyingData))
					if err != nil {
						t.Error(err)
					}
					resp.Attest, resp.Signature = attest, sig
				}
				return resp
			},
			call: certify,
			want: "does not verify: verify certification: the attestation certifies another key",
		},
		{
			name: "another key when loaded again",
			forge: func() forger {
				n := 0
				return func(_ *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
					if req.Op == wire.OpTPMNodeKey {
						if n++; n > 1 {
							resp.Public = otherKey(req).PublicArea()
						}
					}
					if req.Op == wire.OpTPMSign {
						return wire.Failed("tpm.sign: "+wire.NotLoaded, false)
					}
					return resp
				}
			}(),
			call: func(h *helpertpm.TPM) error { return sign(h) },
			want: "tpm.nodekey now derives another key for this unique than before",
		},
		{
			name: "an answer with fields its operation does not answer",
			forge: func(_ *fakeHelper, req *wire.Request, resp *wire.Response) *wire.Response {
				if req.Op == wire.OpTPMSign {
					resp.Public = []byte{1}
				}
				return resp
			},
			call: func(h *helpertpm.TPM) error { return sign(h) },
			want: "answer to tpm.sign carries public",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, h := startFake(t, tt.forge)
			err := tt.call(h)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func sign(h *helpertpm.TPM) error {
	k, err := h.NewNodeKey()
	if err != nil {
		return err
	}
	_, err = k.Sign(nil, sum256("m"), crypto.SHA256)
	return err
}

func certify(h *helpertpm.TPM) error {
	if _, err := h.AKPublic(); err != nil {
		return err
	}
	k, err := h.NewNodeKey()
	if err != nil {
		return err
	}
	_, _, _, err = h.Certify(k, [32]byte{7})
	return err
}

func sum256(s string) []byte { d := sha256.Sum256([]byte(s)); return d[:] }
func sum384(s string) []byte { d := sha512.Sum384([]byte(s)); return d[:] }
func sum512(s string) []byte { d := sha512.Sum512([]byte(s)); return d[:] }
