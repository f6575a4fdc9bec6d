//go:build linux

package helper

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/helpertpm"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

// newTPMServer is a host helper's operations (no socket) over a real swtpm
// the test started.
func newTPMServer(t *testing.T) *opServer {
	t.Helper()
	addr := swtpmtest.Start(t, "").Addr
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.openTPM = func() (*tpm.TPM, error) { return tpm.OpenTCP(addr) }
	})
	t.Cleanup(func() { o.srv.tpm.close() })
	return o
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func unique(i byte) []byte { return bytes.Repeat([]byte{i}, 32) }

// tpmReq is one tpm.* request as JSON; empty byte fields are left out.
func tpmReq(op string, u, digest, qd []byte) string {
	s := `{"v":1,"op":"` + op + `"`
	for _, f := range []struct {
		k string
		v []byte
	}{{"unique", u}, {"digest", digest}, {"qualifying_data", qd}} {
		if f.v != nil {
			s += `,"` + f.k + `":"` + b64(f.v) + `"`
		}
	}
	return s + "}"
}

// mustOK fails unless resp is a success that passes CheckAnswer for op.
func mustOK(t *testing.T, op string, resp *wire.Response) *wire.Response {
	t.Helper()
	if !resp.OK {
		t.Fatalf("%s: %s", op, resp.Error)
	}
	if err := resp.CheckAnswer(op); err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	return resp
}

// refusedWith fails unless resp is a refusal, not retryable, containing want.
func refusedWith(t *testing.T, what string, resp *wire.Response, want string) {
	t.Helper()
	if resp.OK || resp.Retryable || !strings.Contains(resp.Error, want) {
		t.Errorf("%s: ok=%v retryable=%v error=%q, want a refusal containing %q", what, resp.OK, resp.Retryable, resp.Error, want)
	}
}

func (o *opServer) held() [][tpm.UniqueSize]byte {
	o.srv.tpm.mu.Lock()
	defer o.srv.tpm.mu.Unlock()
	var out [][tpm.UniqueSize]byte
	for _, h := range o.srv.tpm.held {
		out = append(out, h.unique)
	}
	return out
}

func TestTPMOperations(t *testing.T) {
	o := newTPMServer(t)
	u := unique(1)

	pubArea := mustOK(t, "tpm.nodekey", o.call(t, tpmReq(wire.OpTPMNodeKey, u, nil, nil))).Public
	pub, err := tpm.CheckNodeKeyPublic(pubArea)
	if err != nil {
		t.Fatalf("tpm.nodekey answered %v", err)
	}
	if again := mustOK(t, "tpm.nodekey", o.call(t, tpmReq(wire.OpTPMNodeKey, u, nil, nil))).Public; !bytes.Equal(again, pubArea) {
		t.Fatal("tpm.nodekey of the same unique answered another key")
	}
	other := mustOK(t, "tpm.nodekey", o.call(t, tpmReq(wire.OpTPMNodeKey, unique(2), nil, nil))).Public
	if bytes.Equal(other, pubArea) {
		t.Fatal("tpm.nodekey of another unique answered the same key")
	}

	for _, n := range []int{32, 48, 64} {
		digest := bytes.Repeat([]byte{byte(n)}, n)
		sig := mustOK(t, "tpm.sign", o.call(t, tpmReq(wire.OpTPMSign, u, digest, nil))).Signature
		if !ecdsa.VerifyASN1(pub, digest, sig) {
			t.Errorf("tpm.sign of a %d-byte digest does not verify against tpm.nodekey's key", n)
		}
		if n == 32 && ecdsa.VerifyASN1(pub, bytes.Repeat([]byte{9}, 32), sig) {
			t.Error("the signature verifies for another digest")
		}
	}

	akPub := mustOK(t, "tpm.ak", o.call(t, `{"v":1,"op":"tpm.ak"}`)).AKPublic
	if _, err := tpm.CheckAKPublic(akPub); err != nil {
		t.Fatalf("tpm.ak answered %v", err)
	}
	qd := sha256.Sum256([]byte("a CSR"))
	c := mustOK(t, "tpm.certify", o.call(t, tpmReq(wire.OpTPMCertify, u, nil, qd[:])))
	if !bytes.Equal(c.AKPublic, akPub) {
		t.Error("tpm.certify answered another AK than tpm.ak")
	}
	if err := tpm.VerifyCertify(akPub, c.Attest, c.Signature, pubArea, qd); err != nil {
		t.Errorf("tpm.certify's certification does not verify: %v", err)
	}
	if err := tpm.VerifyCertify(akPub, c.Attest, c.Signature, other, qd); err == nil {
		t.Error("tpm.certify's certification verifies for another key")
	}

	mustOK(t, "tpm.release", o.call(t, tpmReq(wire.OpTPMRelease, u, nil, nil)))
	if got := o.held(); len(got) != 1 || !bytes.Equal(got[0][:], unique(2)) {
		t.Errorf("after tpm.release the helper holds %x, want only unique 2", got)
	}
	refusedWith(t, "tpm.sign after tpm.release", o.call(t, tpmReq(wire.OpTPMSign, u, make([]byte, 32), nil)), wire.NotLoaded)
	if again := mustOK(t, "tpm.nodekey", o.call(t, tpmReq(wire.OpTPMNodeKey, u, nil, nil))).Public; !bytes.Equal(again, pubArea) {
		t.Fatal("tpm.nodekey after tpm.release answered another key")
	}
	sig := mustOK(t, "tpm.sign", o.call(t, tpmReq(wire.OpTPMSign, u, qd[:], nil))).Signature
	if !ecdsa.VerifyASN1(pub, qd[:], sig) {
		t.Error("tpm.sign after loading the key again does not verify")
	}

	// Logged: every tpm.* call but a successful tpm.sign.
	var ops []string
	for _, l := range o.logs.lines(t, "helper: operation") {
		ops = append(ops, fmt.Sprint(l["op"], " ", l["outcome"]))
		if l["key"] == nil && l["op"] != wire.OpTPMAK {
			t.Errorf("a %s log line without the key: %v", l["op"], l)
		}
	}
	want := []string{"tpm.nodekey ok", "tpm.nodekey ok", "tpm.nodekey ok", "tpm.ak ok", "tpm.certify ok",
		"tpm.release ok", "tpm.sign refused", "tpm.nodekey ok"}
	if strings.Join(ops, ", ") != strings.Join(want, ", ") {
		t.Errorf("logged %q, want %q", ops, want)
	}
}

func TestTPMRefusals(t *testing.T) {
	o := newTPMServer(t)
	u := unique(1)
	mustOK(t, "tpm.nodekey", o.call(t, tpmReq(wire.OpTPMNodeKey, u, nil, nil)))
	unknown := unique(7)
	tests := []struct {
		name, req, want string
	}{
		{"nodekey short unique", tpmReq(wire.OpTPMNodeKey, make([]byte, 31), nil, nil), "unique is 31 bytes, want 32"},
		{"nodekey long unique", tpmReq(wire.OpTPMNodeKey, make([]byte, 33), nil, nil), "unique is 33 bytes, want 32"},
		{"nodekey no unique", `{"v":1,"op":"tpm.nodekey"}`, "unique is 0 bytes, want 32"},
		{"nodekey with a digest", tpmReq(wire.OpTPMNodeKey, unique(3), make([]byte, 32), nil), "tpm.nodekey takes no digest"},
		{"sign 20-byte digest", tpmReq(wire.OpTPMSign, u, make([]byte, 20), nil), "digest is 20 bytes, want 32, 48 or 64"},
		{"sign 33-byte digest", tpmReq(wire.OpTPMSign, u, make([]byte, 33), nil), "digest is 33 bytes"},
		{"sign no digest", tpmReq(wire.OpTPMSign, u, nil, nil), "digest is 0 bytes"},
		{"sign short unique", tpmReq(wire.OpTPMSign, make([]byte, 16), make([]byte, 32), nil), "unique is 16 bytes"},
		{"sign unknown unique", tpmReq(wire.OpTPMSign, unknown, make([]byte, 32), nil), "tpm.sign: " + wire.NotLoaded},
		{"certify 31-byte qualifying data", tpmReq(wire.OpTPMCertify, u, nil, make([]byte, 31)), "qualifying_data is 31 bytes, want 32"},
		{"certify 64-byte qualifying data", tpmReq(wire.OpTPMCertify, u, nil, make([]byte, 64)), "qualifying_data is 64 bytes, want 32"},
		{"certify unknown unique", tpmReq(wire.OpTPMCertify, unknown, nil, make([]byte, 32)), "tpm.certify: " + wire.NotLoaded},
		{"release short unique", tpmReq(wire.OpTPMRelease, make([]byte, 8), nil, nil), "unique is 8 bytes"},
		{"release unknown unique", tpmReq(wire.OpTPMRelease, unknown, nil, nil), "tpm.release: " + wire.NotLoaded},
		{"ak with a unique", tpmReq(wire.OpTPMAK, u, nil, nil), "tpm.ak takes no unique"},
		{"another tpm verb", `{"v":1,"op":"tpm.clear"}`, `unknown operation "tpm.clear"`},
		{"unique not base64", `{"v":1,"op":"tpm.nodekey","unique":"%%%"}`, "request"},
		{"unknown field", `{"v":1,"op":"tpm.nodekey","unique":"` + b64(unique(4)) + `","hierarchy":"platform"}`, `unknown field "hierarchy"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refusedWith(t, tt.name, o.call(t, tt.req), tt.want)
			if got := o.held(); len(got) != 1 || !bytes.Equal(got[0][:], u) {
				t.Errorf("after a refusal the helper holds %x, want only unique 1", got)
			}
		})
	}
	// The held key still works.
	mustOK(t, "tpm.sign", o.call(t, tpmReq(wire.OpTPMSign, u, make([]byte, 32), nil)))
}

// TestTPMLeastRecentlyUsed: a ninth key unloads the least recently used
// one, which is refused until tpm.nodekey loads it again, then answers the
// same key and signs; the others stay usable.
func TestTPMLeastRecentlyUsed(t *testing.T) {
	o := newTPMServer(t)
	pubs := map[byte][]byte{}
	for i := byte(1); i <= maxNodeKeys; i++ {
		pubs[i] = mustOK(t, "tpm.nodekey", o.call(t, tpmReq(wire.OpTPMNodeKey, unique(i), nil, nil))).Public
	}
	// Use key 1, so key 2 is now the least recently used.
	mustOK(t, "tpm.sign", o.call(t, tpmReq(wire.OpTPMSign, unique(1), make([]byte, 32), nil)))
	pubs[9] = mustOK(t, "tpm.nodekey", o.call(t, tpmReq(wire.OpTPMNodeKey, unique(9), nil, nil))).Public
	if got := o.held(); len(got) != maxNodeKeys {
		t.Fatalf("the helper holds %d keys, want %d", len(got), maxNodeKeys)
	}
	refusedWith(t, "tpm.sign of the unloaded key", o.call(t, tpmReq(wire.OpTPMSign, unique(2), make([]byte, 32), nil)), wire.NotLoaded)
	refusedWith(t, "tpm.certify of the unloaded key", o.call(t, tpmReq(wire.OpTPMCertify, unique(2), nil, make([]byte, 32))), wire.NotLoaded)
	for _, i := range []byte{1, 3, 8, 9} {
		sig := mustOK(t, "tpm.sign", o.call(t, tpmReq(wire.OpTPMSign, unique(i), make([]byte, 32), nil))).Signature
		pub, _ := tpm.CheckNodeKeyPublic(pubs[i])
		if !ecdsa.VerifyASN1(pub, make([]byte, 32), sig) {
			t.Errorf("key %d's signature does not verify", i)
		}
	}
	// Loaded again: the same key, and it signs; now 4 (least recently used) goes.
	again := mustOK(t, "tpm.nodekey", o.call(t, tpmReq(wire.OpTPMNodeKey, unique(2), nil, nil))).Public
	if !bytes.Equal(again, pubs[2]) {
		t.Fatal("the unloaded key, loaded again, is another key")
	}
	digest := sha256.Sum256([]byte("after reload"))
	sig := mustOK(t, "tpm.sign", o.call(t, tpmReq(wire.OpTPMSign, unique(2), digest[:], nil))).Signature
	pub, _ := tpm.CheckNodeKeyPublic(pubs[2])
	if !ecdsa.VerifyASN1(pub, digest[:], sig) {
		t.Error("the reloaded key's signature does not verify")
	}
	refusedWith(t, "tpm.sign of key 4", o.call(t, tpmReq(wire.OpTPMSign, unique(4), make([]byte, 32), nil)), wire.NotLoaded)
	if got := o.held(); len(got) != maxNodeKeys {
		t.Fatalf("the helper holds %d keys, want %d", len(got), maxNodeKeys)
	}
	if n := len(o.logs.lines(t, "helper: unloaded the least recently used node key")); n != 2 {
		t.Errorf("logged %d unloads, want 2", n)
	}
}

func TestTPMNoTPM(t *testing.T) {
	opened := 0
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.openTPM = func() (*tpm.TPM, error) { opened++; return nil, errNoTPM }
	})
	for _, req := range []string{
		tpmReq(wire.OpTPMNodeKey, unique(1), nil, nil),
		tpmReq(wire.OpTPMSign, unique(1), make([]byte, 32), nil),
		`{"v":1,"op":"tpm.ak"}`,
		tpmReq(wire.OpTPMCertify, unique(1), nil, make([]byte, 32)),
		tpmReq(wire.OpTPMRelease, unique(1), nil, nil),
	} {
		resp := o.call(t, req)
		if resp.OK || resp.Retryable || resp.Error != "node keys in the TPM are not served by this helper (the host has no TPM)" {
			t.Errorf("%s: %+v, want wire.NoTPM", req, resp)
		}
	}
	if opened != 5 {
		t.Errorf("looked for the TPM %d times, want 5 (once per call: it may appear)", opened)
	}
	// A request out of shape is refused for its shape first.
	refusedWith(t, "short unique", o.call(t, tpmReq(wire.OpTPMNodeKey, unique(1)[:5], nil, nil)), "unique is 5 bytes")

	// A TPM that is there but does not open fails, retryable.
	o = newOpServer(t, func(s *seams, _ *execLog) {
		s.openTPM = func() (*tpm.TPM, error) { return nil, errors.New("open TPM /dev/tpmrm0 = permission denied") }
	})
	resp := o.call(t, `{"v":1,"op":"tpm.ak"}`)
	if resp.OK || !resp.Retryable || !strings.Contains(resp.Error, "tpm.ak: open TPM /dev/tpmrm0 = permission denied") {
		t.Errorf("a TPM that does not open: %+v", resp)
	}
}

// TestTPMOverTheSocket runs the operations through the helper's socket and
// helperclient, as bcd node sends them.
func TestTPMOverTheSocket(t *testing.T) {
	addr := swtpmtest.Start(t, "").Addr
	h := startHelper(t, func(_ *Config, s *seams) {
		s.openTPM = func() (*tpm.TPM, error) { return tpm.OpenTCP(addr) }
	})
	ctx := context.Background()
	u := unique(5)
	public, err := h.client.TPMNodeKey(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := tpm.CheckNodeKeyPublic(public)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte("over the socket"))
	sig, err := h.client.TPMSign(ctx, u, digest[:])
	if err != nil || !ecdsa.VerifyASN1(pub, digest[:], sig) {
		t.Fatalf("TPMSign: %v (or the signature does not verify)", err)
	}
	attest, csig, ak, err := h.client.TPMCertify(ctx, u, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	if err := tpm.VerifyCertify(ak, attest, csig, public, digest); err != nil {
		t.Fatal(err)
	}
	if err := h.client.TPMRelease(ctx, u); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.TPMSign(ctx, u, digest[:]); err == nil || !strings.Contains(err.Error(), wire.NotLoaded) {
		t.Fatalf("TPMSign after TPMRelease: %v", err)
	}
}

// TestTPMNodeSideThroughHelper: bcd node's side (helpertpm) against the
// real helper and a real swtpm: a key, a CSR, a certification that
// verifies under the AK, and a key the helper unloaded as the least
// recently used announced again by the node at its next signature.
func TestTPMNodeSideThroughHelper(t *testing.T) {
	addr := swtpmtest.Start(t, "").Addr
	h := startHelper(t, func(_ *Config, s *seams) {
		s.openTPM = func() (*tpm.TPM, error) { return tpm.OpenTCP(addr) }
	})
	node := helpertpm.New(h.client)
	k, err := node.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(k, "n1")
	if err != nil {
		t.Fatal(err)
	}
	qd := sha256.Sum256(csr)
	keyPub, attest, sig, err := node.Certify(k, qd)
	if err != nil {
		t.Fatal(err)
	}
	ak, err := node.AKPublic()
	if err != nil {
		t.Fatal(err)
	}
	if err := tpm.VerifyCertify(ak, attest, sig, keyPub, qd); err != nil {
		t.Fatal(err)
	}
	for i := byte(100); i < 100+maxNodeKeys; i++ {
		if _, err := h.client.TPMNodeKey(context.Background(), unique(i)); err != nil {
			t.Fatal(err)
		}
	}
	u := k.(*helpertpm.Key).TPMUnique()
	if _, err := h.client.TPMSign(context.Background(), u[:], qd[:]); !helperclient.IsNotLoaded(err) {
		t.Fatalf("the node's key is still held after %d others: %v", maxNodeKeys, err)
	}
	msg := []byte("after the helper unloaded the key")
	s, err := pki.Sign(k, "bcd test", msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.Verify(k.Public(), "bcd test", msg, s); err != nil {
		t.Fatal(err)
	}
}

// TestOpenHostTPM: a fakehw build opens the swtpm of BCD_FAKEHW_SWTPM and
// has no TPM without it; a host build has none without /dev/tpmrm0.
func TestOpenHostTPM(t *testing.T) {
	t.Setenv(fakeSWTPMEnv, "")
	if _, err := openFakeTPM(); !errors.Is(err, errNoTPM) {
		t.Errorf("fakehw without %s: %v, want no TPM", fakeSWTPMEnv, err)
	}
	t.Setenv(fakeSWTPMEnv, swtpmtest.Start(t, "").Addr)
	tp, err := openFakeTPM()
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	if _, err := tp.AK(); err != nil {
		t.Errorf("the fakehw swtpm: %v", err)
	}
	if _, err := os.Stat(tpm.DefaultPath); errors.Is(err, os.ErrNotExist) {
		if _, err := openDeviceTPM(tpm.DefaultPath); !errors.Is(err, errNoTPM) {
			t.Errorf("a host without %s: %v, want no TPM", tpm.DefaultPath, err)
		}
	}
}

// BenchmarkTPMSign measures a node's signature through the helper
// (helpertpm, the socket, the helper, swtpm) next to one by the TPM
// directly.
func BenchmarkTPMSign(b *testing.B) {
	digest := sha256.Sum256([]byte("bench"))
	b.Run("through the helper", func(b *testing.B) {
		addr := swtpmtest.Start(b, "").Addr
		h := startHelper(b, func(_ *Config, s *seams) {
			s.openTPM = func() (*tpm.TPM, error) { return tpm.OpenTCP(addr) }
		})
		k, err := helpertpm.New(h.client).NewNodeKey()
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for b.Loop() {
			if _, err := k.Sign(nil, digest[:], nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("directly", func(b *testing.B) {
		tp, err := tpm.OpenTCP(swtpmtest.Start(b, "").Addr)
		if err != nil {
			b.Fatal(err)
		}
		defer tp.Close()
		k, err := tp.NodeKey([32]byte{1})
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := k.Sign(nil, digest[:], nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}
