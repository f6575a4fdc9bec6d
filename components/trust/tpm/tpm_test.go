package tpm

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/google/go-tpm/tpm2"
)

func unique(b byte) [UniqueSize]byte {
	var u [UniqueSize]byte
	for i := range u {
		u[i] = b + byte(i)
	}
	return u
}

func nodeKey(t *testing.T, tp *TPM, u [UniqueSize]byte) *Key {
	t.Helper()
	k, err := tp.NodeKey(u)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestNodeKeyStableAcrossReopen(t *testing.T) {
	sw := startSWTPM(t, "")
	tp := sw.open(t)
	a := nodeKey(t, tp, unique(1))
	b := nodeKey(t, tp, unique(2))
	if a.Public().(*ecdsa.PublicKey).Equal(b.Public()) {
		t.Fatal("two uniques derived the same node key")
	}
	if again := nodeKey(t, tp, unique(1)); !bytes.Equal(again.PublicArea(), a.PublicArea()) {
		t.Fatal("the same unique derived another node key")
	}
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	sw.stop()

	tp2 := startSWTPM(t, sw.dir).open(t)
	a2 := nodeKey(t, tp2, unique(1))
	if !bytes.Equal(a2.PublicArea(), a.PublicArea()) || !a2.Public().(*ecdsa.PublicKey).Equal(a.Public()) {
		t.Fatal("the node key changed when swtpm restarted on the same state")
	}
	if !bytes.Equal(a2.Name(), a.Name()) {
		t.Fatal("the node key's name changed")
	}
	ak2, err := tp2.AK()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ak2.PublicArea(), ak.PublicArea()) {
		t.Fatal("the AK changed when swtpm restarted on the same state")
	}

	// A new random unique names another key.
	u, err := NewUnique()
	if err != nil {
		t.Fatal(err)
	}
	if nodeKey(t, tp2, u).Public().(*ecdsa.PublicKey).Equal(a.Public()) {
		t.Fatal("a random unique derived the same node key")
	}

	// Another TPM derives other keys from the same unique.
	other := nodeKey(t, openSWTPM(t), unique(1))
	if other.Public().(*ecdsa.PublicKey).Equal(a.Public()) {
		t.Fatal("two TPMs derived the same node key")
	}
}

func TestNodeKeyPublicArea(t *testing.T) {
	tp := openSWTPM(t)
	k := nodeKey(t, tp, unique(7))
	pub, err := CheckNodeKeyPublic(k.PublicArea())
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Equal(k.Public()) || pub.Curve != elliptic.P256() {
		t.Fatal("CheckNodeKeyPublic answered another key")
	}
	if _, err := CheckAKPublic(k.PublicArea()); err == nil {
		t.Fatal("a node key passed as an AK")
	}
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CheckNodeKeyPublic(ak.PublicArea()); err == nil {
		t.Fatal("the AK passed as a node key")
	}
	p, err := tpm2.Unmarshal[tpm2.TPMTPublic](ak.PublicArea())
	if err != nil {
		t.Fatal(err)
	}
	if a := p.ObjectAttributes; !a.Restricted || !a.SignEncrypt || !a.FixedTPM || a.Decrypt {
		t.Fatalf("AK attributes %+v", a)
	}
	// Trailing bytes are refused.
	if _, err := CheckNodeKeyPublic(append(k.PublicArea(), 0)); err == nil {
		t.Fatal("a public area with a trailing byte passed")
	}
}

func TestSignVerifies(t *testing.T) {
	tp := openSWTPM(t)
	k := nodeKey(t, tp, unique(3))
	msg := []byte("this node says")
	for _, h := range []crypto.Hash{crypto.SHA256, crypto.SHA384, crypto.SHA512} {
		hh := h.New()
		hh.Write(msg)
		d := hh.Sum(nil)
		sig, err := k.Sign(rand.Reader, d, h)
		if err != nil {
			t.Fatalf("%v: %v", h, err)
		}
		if !ecdsa.VerifyASN1(k.Public().(*ecdsa.PublicKey), d, sig) {
			t.Fatalf("%v: signature does not verify", h)
		}
		d[len(d)-1] ^= 1
		if h != crypto.SHA256 {
			// ECDSA P-256 uses the leftmost 32 bytes; a change there counts.
			d[len(d)-1] ^= 1
			d[0] ^= 1
		}
		if ecdsa.VerifyASN1(k.Public().(*ecdsa.PublicKey), d, sig) {
			t.Fatalf("%v: signature verifies for another digest", h)
		}
	}
	// nil opts: the size alone decides.
	d := sha512.Sum384(msg)
	if sig, err := k.Sign(nil, d[:], nil); err != nil || !ecdsa.VerifyASN1(k.Public().(*ecdsa.PublicKey), d[:], sig) {
		t.Fatalf("sign with nil opts: %v", err)
	}
}

func TestSignDigestSizes(t *testing.T) {
	tp := openSWTPM(t)
	k := nodeKey(t, tp, unique(4))
	for _, n := range []int{0, 1, 20, 31, 33, 47, 49, 63, 65, 128} {
		if _, err := k.Sign(nil, make([]byte, n), nil); err == nil || !strings.Contains(err.Error(), "want 32, 48 or 64") {
			t.Errorf("%d-byte digest: %v", n, err)
		}
	}
	if _, err := k.Sign(nil, make([]byte, 32), crypto.SHA384); err == nil {
		t.Error("a 32-byte digest named SHA-384 was signed")
	}
	if _, err := k.Sign(nil, make([]byte, 64), crypto.SHA256); err == nil {
		t.Error("a 64-byte digest named SHA-256 was signed")
	}
	if _, err := k.Sign(nil, make([]byte, 32), crypto.Hash(0)); err == nil {
		t.Error("an unhashed message was signed")
	}
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256([]byte("x"))
	if _, err := ak.Sign(nil, d[:], crypto.SHA256); err == nil {
		t.Error("the AK signed a digest")
	}
}

func TestPKISignVerify(t *testing.T) {
	tp := openSWTPM(t)
	k := nodeKey(t, tp, unique(5))
	msg := []byte(`{"node":"n1","csr":"..."}`)
	sig, err := pki.Sign(k, pki.PurposeRenew, msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.Verify(k.Public(), pki.PurposeRenew, msg, sig); err != nil {
		t.Fatal(err)
	}
	if err := pki.Verify(k.Public(), pki.PurposeJoinResponse, msg, sig); err == nil {
		t.Fatal("a renewal signature verified as a join response")
	}
	other := nodeKey(t, tp, unique(6))
	if err := pki.Verify(other.Public(), pki.PurposeRenew, msg, sig); err == nil {
		t.Fatal("the signature verified under another node key")
	}
	// A CSR signed in the TPM.
	der, err := pki.CreateCSR(k, "n1")
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.ParseCSR(der)
	if err != nil {
		t.Fatal(err)
	}
	if !k.Public().(*ecdsa.PublicKey).Equal(csr.PublicKey) {
		t.Fatal("the CSR names another key")
	}
}

func TestTLSHandshakeWithTPMKey(t *testing.T) {
	tp := openSWTPM(t)
	k := nodeKey(t, tp, unique(8))

	nodeCA, err := pki.NewCA("bcd node CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := nodeCA.IssueClient(k.Public(), "n1", pki.SPIFFEID("example.test", "node", "n1"), "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	servingCA, err := pki.NewCA("bcd serving CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	skey, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	scert, err := servingCA.IssueServer(skey.Public(), []string{"gw.example.test"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serverCfg := pki.ServerTLS(pki.TLSCertificate(scert, skey, servingCA.Cert), nodeCA.Cert)
	clientCert := pki.TLSCertificate(leaf, k)
	clientCfg, err := pki.ClientTLS(pki.PinOfCert(servingCA.Cert), "gw.example.test", &clientCert)
	if err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		state tls.ConnectionState
		err   error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		sc := tls.Server(c, serverCfg)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		err = sc.Handshake()
		if err == nil {
			_, err = sc.Write([]byte("ok"))
		}
		done <- result{state: sc.ConnectionState(), err: err}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), clientCfg)
	if err != nil {
		t.Fatalf("TLS handshake with the TPM key: %v", err)
	}
	defer c.Close()
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	if r.state.Version != tls.VersionTLS13 || len(r.state.VerifiedChains) == 0 {
		t.Fatalf("server did not verify the client certificate (version %#x, %d chains)", r.state.Version, len(r.state.VerifiedChains))
	}
	if !bytes.Equal(r.state.PeerCertificates[0].Raw, leaf.Raw) {
		t.Fatal("server saw another client certificate")
	}
}

func TestKeyCacheFlushesBeyondMax(t *testing.T) {
	sw := startSWTPM(t, "")
	inner, err := OpenTCP(sw.addr)
	if err != nil {
		t.Fatal(err)
	}
	rm := newResourceManager(inner.tr)
	tp := OpenTransport(rm)
	defer tp.Close()

	var keys []*Key
	for i := range MaxLoaded + 3 {
		keys = append(keys, nodeKey(t, tp, unique(byte(10*i))))
		if want := min(i+1, MaxLoaded); rm.alive() != want || len(tp.loaded) != want {
			t.Fatalf("after %d keys: %d objects in the TPM, %d in the cache, want %d", i+1, rm.alive(), len(tp.loaded), want)
		}
	}
	// The three least recently used went, in order.
	if len(rm.flushed) != 3 || rm.flushed[0] != virtualBase || rm.flushed[1] != virtualBase+1 || rm.flushed[2] != virtualBase+2 {
		t.Fatalf("flushed %#x, want the first three keys", rm.flushed)
	}
	// Using key 3 makes key 4 the least recently used.
	d := sha256.Sum256([]byte("m"))
	if _, err := keys[3].Sign(nil, d[:], crypto.SHA256); err != nil {
		t.Fatal(err)
	}
	// Key 0 is derived again, the same key, and key 4 makes room.
	sig, err := keys[0].Sign(nil, d[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(keys[0].Public().(*ecdsa.PublicKey), d[:], sig) {
		t.Fatal("key 0's signature does not verify after it was derived again")
	}
	if got := rm.flushed[len(rm.flushed)-1]; got != virtualBase+4 {
		t.Fatalf("flushed %#x, want key 4 (%#x)", got, virtualBase+4)
	}
	if rm.alive() != MaxLoaded {
		t.Fatalf("%d objects in the TPM, want %d", rm.alive(), MaxLoaded)
	}
	// Release unloads; Close unloads the rest.
	if err := keys[0].Release(); err != nil {
		t.Fatal(err)
	}
	if rm.alive() != MaxLoaded-1 {
		t.Fatalf("%d objects after Release, want %d", rm.alive(), MaxLoaded-1)
	}
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	if rm.alive() != 0 {
		t.Fatalf("%d objects left after Close", rm.alive())
	}
}

func TestKeyCacheOnTPMWithFewSlots(t *testing.T) {
	// swtpm without a resource manager has room for three objects; the
	// cache gives slots back when the TPM runs out.
	sw := startSWTPM(t, "")
	tp := sw.open(t)
	d := sha256.Sum256([]byte("m"))
	var keys []*Key
	for i := range 6 {
		k := nodeKey(t, tp, unique(byte(i)))
		keys = append(keys, k)
		if _, err := k.Sign(nil, d[:], crypto.SHA256); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		if sig, err := k.Sign(nil, d[:], crypto.SHA256); err != nil || !ecdsa.VerifyASN1(k.Public().(*ecdsa.PublicKey), d[:], sig) {
			t.Fatalf("sign again: %v", err)
		}
	}
	ak, err := tp.AK()
	if err != nil {
		t.Fatal(err)
	}
	var q [QualifyingDataSize]byte
	if _, _, err := tp.Certify(keys[0], ak, q); err != nil {
		t.Fatal(err)
	}
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	// Close left nothing loaded.
	if n := transientHandles(t, sw.open(t)); n != 0 {
		t.Fatalf("%d transient objects left after Close", n)
	}
}

func transientHandles(t *testing.T, tp *TPM) int {
	t.Helper()
	rsp, err := tpm2.GetCapability{Capability: tpm2.TPMCapHandles, Property: 0x80000000, PropertyCount: 64}.Execute(tp.tr)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := rsp.CapabilityData.Data.Handles()
	if err != nil {
		t.Fatal(err)
	}
	return len(hs.Handle)
}

func TestClosedTPM(t *testing.T) {
	tp := openSWTPM(t)
	k := nodeKey(t, tp, unique(9))
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256([]byte("m"))
	if _, err := k.Sign(nil, d[:], crypto.SHA256); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("sign after Close: %v", err)
	}
}

func TestOpenMissingDevice(t *testing.T) {
	_, err := Open(t.TempDir() + "/tpmrm0")
	if err == nil || !strings.Contains(err.Error(), "open TPM") {
		t.Fatalf("Open of a missing device: %v", err)
	}
}

func TestConcurrentSigners(t *testing.T) {
	tp := openSWTPM(t)
	var keys []*Key
	for i := range 5 {
		keys = append(keys, nodeKey(t, tp, unique(byte(40+i))))
	}
	errs := make(chan error, 4*len(keys))
	for g := range 4 {
		go func() {
			for i := range keys {
				k := keys[(g+i)%len(keys)]
				d := sha256.Sum256([]byte{byte(g), byte(i)})
				sig, err := k.Sign(nil, d[:], crypto.SHA256)
				if err == nil && !ecdsa.VerifyASN1(k.Public().(*ecdsa.PublicKey), d[:], sig) {
					err = errors.New("signature does not verify")
				}
				errs <- err
			}
		}()
	}
	for range 4 * len(keys) {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
