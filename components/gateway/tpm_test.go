package gateway_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/agent/renew"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// newTPM starts a swtpm on state (a fresh one when empty) and opens it.
func newTPM(t *testing.T, state string) *nodetpm.TPM {
	t.Helper()
	sw := swtpmtest.Start(t, state)
	tp, err := nodetpm.OpenTCP(sw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	return tp
}

// enrollEK enrols the TPM's EK public key (as PEM) for site rack1.
func enrollEK(t *testing.T, g *gw, tp *nodetpm.TPM) string {
	t.Helper()
	ek, err := tp.EKPublicPEM()
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.s.EnrollTPM(adminapi.TPMEnrollRequest{EKPublic: ek, Site: "rack1"})
	if err != nil {
		t.Fatal(err)
	}
	return out.EK
}

func tpmJoinOpts(g *gw, cl bcdv1connect.AgentGatewayClient, tp join.TPM, dir string) join.Options {
	return join.Options{
		Client: cl, Role: "node", Attestor: "tpm", TPM: tp, SigningPin: g.pins.JoinSigning,
		Claims: &bcdv1.HardwareClaims{Hostname: "tpm-host"}, DataDir: dir, MaxAttempts: 1,
	}
}

// tpmRequest builds a tpm JoinRequest by hand: a new node key in keyTPM,
// certified by akTPM's AK, with ekTPM's EK.
func tpmRequest(t *testing.T, ekTPM, akTPM, keyTPM *nodetpm.TPM) (*bcdv1.JoinRequest, crypto.Signer) {
	t.Helper()
	key, err := keyTPM.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(key, "raw-tpm-join")
	if err != nil {
		t.Fatal(err)
	}
	var keyPub, attest, sig []byte
	if akTPM == keyTPM {
		keyPub, attest, sig, err = akTPM.Certify(key, sha256.Sum256(csr))
		if err != nil {
			t.Fatal(err)
		}
	}
	akPub, err := akTPM.AKPublic()
	if err != nil {
		t.Fatal(err)
	}
	ekPub, ekCert, err := ekTPM.EK()
	if err != nil {
		t.Fatal(err)
	}
	return &bcdv1.JoinRequest{Role: "node", Attestor: "tpm", Csr: csr, Tpm: &bcdv1.TPMAttestation{
		EkPublic: ekPub, EkCertificate: ekCert, AkPublic: akPub, KeyPublic: keyPub, CertifyInfo: attest, CertifySignature: sig,
	}}, key
}

func call(cl bcdv1connect.AgentGatewayClient, req *bcdv1.JoinRequest) (*bcdv1.JoinResponse, error) {
	r, err := cl.Join(context.Background(), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}

// TestTPMJoin: a tpm join against swtpm answers one credential activation
// challenge; the certificate and the node record name the AK; node.key
// records the key's unique and loads from the TPM.
func TestTPMJoin(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	tp := newTPM(t, "")
	pin := enrollEK(t, g, tp)
	dir := t.TempDir()
	a, err := join.Join(context.Background(), tpmJoinOpts(g, g.client(t, nil), tp, dir))
	if err != nil {
		t.Fatalf("tpm join: %v", err)
	}
	akPub, _ := tp.AKPublic()
	akName := join.AKName(akPub)
	got, err := identity.CertAK(a.Cert)
	if err != nil || !bytes.Equal(got, akName) {
		t.Fatalf("certificate names AK %x (%v), want %x", got, err, akName)
	}
	n, err := g.s.Store().Node(a.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if n.AK != hex.EncodeToString(akName) || n.EK != pin || n.Site != "rack1" || !bytes.Equal(n.AKPublic, akPub) {
		t.Errorf("stored node AK %s EK %s site %s, want %x %s rack1", n.AK, n.EK, n.Site, akName, pin)
	}
	if a.KeyHolder != identity.KeyInTPM {
		t.Errorf("key holder %q, want %q", a.KeyHolder, identity.KeyInTPM)
	}
	raw, err := os.ReadFile(dir + "/" + identity.KeyFile)
	if err != nil || !strings.HasPrefix(string(raw), `{"tpm":{"unique":"`) || strings.Contains(string(raw), "PRIVATE KEY") {
		t.Errorf("node.key is %q (%v), want the TPM record", raw, err)
	}
	loaded, err := identity.LoadWith(dir, tp)
	if err != nil || loaded.KeyHolder != identity.KeyInTPM {
		t.Fatalf("LoadWith: %v %+v", err, loaded)
	}
	// The loaded key signs, through the TPM, for the certificate's key.
	sig, err := pki.Sign(loaded.Key, pki.PurposeRenew, []byte("x"))
	if err != nil || pki.Verify(a.Cert.PublicKey, pki.PurposeRenew, []byte("x"), sig) != nil {
		t.Fatalf("sign with the loaded TPM key: %v", err)
	}
	// Without the TPM it loads, says where the key is, and refuses to sign.
	noTPM, err := identity.Load(dir)
	if err != nil || noTPM.KeyHolder != identity.KeyInTPM {
		t.Fatalf("Load without TPM: %v", err)
	}
	if _, err := pki.Sign(noTPM.Key, pki.PurposeRenew, []byte("x")); err == nil {
		t.Error("a TPM key signed without the TPM")
	}
	if c := strings.Count(g.logs.String(), `"msg":"TPM challenge sent"`); c != 1 {
		t.Errorf("%d challenges sent, want 1", c)
	}
	// Another TPM derives another key from the same unique: refused.
	if _, err := identity.LoadWith(dir, newTPM(t, "")); err == nil || !strings.Contains(err.Error(), "another key") {
		t.Errorf("LoadWith another TPM: %v, want a refusal", err)
	}
}

// TestTPMJoinRefusals: an unenrolled EK, a replayed answer, an answer for
// another request, a wrong answer, a forged certification and an AK of
// another TPM are refused; an unknown challenge gets a new one, at most 3.
func TestTPMJoinRefusals(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	cl := g.client(t, nil)
	tp := newTPM(t, "")
	other := newTPM(t, "")

	t.Run("EK not enrolled", func(t *testing.T) {
		req, _ := tpmRequest(t, tp, tp, tp)
		_, err := call(cl, req)
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "is not enrolled") || !strings.Contains(err.Error(), "sha256/") {
			t.Fatalf("err = %v, want PermissionDenied naming the EK pin", err)
		}
		if _, err := join.Join(context.Background(), tpmJoinOpts(g, cl, tp, t.TempDir())); err == nil || !strings.Contains(err.Error(), "Join refused") {
			t.Fatalf("join.Join with an unenrolled EK: %v", err)
		}
	})
	enrollEK(t, g, tp)
	nodes := func() int { ns, _ := g.s.Store().Nodes(); return len(ns) }

	t.Run("replayed answer", func(t *testing.T) {
		req, _ := tpmRequest(t, tp, tp, tp)
		resp, err := call(cl, req)
		if err != nil || resp.GetChallenge() == nil || resp.GetChallenge().GetRound() != 1 {
			t.Fatalf("first call: %v %v, want a round-1 challenge", err, resp)
		}
		ch := resp.GetChallenge()
		secret, err := tp.ActivateCredential(ch.GetCredentialBlob(), ch.GetEncryptedSecret())
		if err != nil {
			t.Fatal(err)
		}
		req.Tpm.ChallengeId, req.Tpm.ChallengeAnswer = ch.GetId(), secret
		if resp, err := call(cl, req); err != nil || len(resp.GetResult()) == 0 {
			t.Fatalf("answer: %v", err)
		}
		before := nodes()
		_, err = call(cl, req)
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "already answered") {
			t.Fatalf("replayed answer: %v, want PermissionDenied (already answered)", err)
		}
		if nodes() != before {
			t.Error("a replayed answer added a node")
		}
	})

	t.Run("answer for another request", func(t *testing.T) {
		req, _ := tpmRequest(t, tp, tp, tp)
		resp, err := call(cl, req)
		if err != nil {
			t.Fatal(err)
		}
		ch := resp.GetChallenge()
		secret, err := tp.ActivateCredential(ch.GetCredentialBlob(), ch.GetEncryptedSecret())
		if err != nil {
			t.Fatal(err)
		}
		req2, _ := tpmRequest(t, tp, tp, tp)
		req2.Tpm.ChallengeId, req2.Tpm.ChallengeAnswer = ch.GetId(), secret
		if _, err := call(cl, req2); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "another request") {
			t.Fatalf("answer moved to another request: %v", err)
		}
	})

	t.Run("wrong answer", func(t *testing.T) {
		req, _ := tpmRequest(t, tp, tp, tp)
		resp, err := call(cl, req)
		if err != nil {
			t.Fatal(err)
		}
		req.Tpm.ChallengeId, req.Tpm.ChallengeAnswer = resp.GetChallenge().GetId(), bytes.Repeat([]byte{7}, 32)
		if _, err := call(cl, req); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "answered wrongly") {
			t.Fatalf("wrong answer: %v", err)
		}
	})

	t.Run("forged certification", func(t *testing.T) {
		// The CSR's key is certified over the right data, but the
		// certification is of another key the AK certified.
		req, _ := tpmRequest(t, tp, tp, tp)
		otherKey, err := tp.NewNodeKey()
		if err != nil {
			t.Fatal(err)
		}
		keyPub, attest, sig, err := tp.Certify(otherKey, sha256.Sum256(req.GetCsr()))
		if err != nil {
			t.Fatal(err)
		}
		for name, mod := range map[string]func(a *bcdv1.TPMAttestation){
			"another key's certification": func(a *bcdv1.TPMAttestation) {
				a.KeyPublic, a.CertifyInfo, a.CertifySignature = keyPub, attest, sig
			},
			"another key's certification under the CSR key's public area": func(a *bcdv1.TPMAttestation) {
				a.CertifyInfo, a.CertifySignature = attest, sig
			},
			"no certification": func(a *bcdv1.TPMAttestation) { a.CertifyInfo, a.CertifySignature = nil, nil },
		} {
			r := &bcdv1.JoinRequest{Role: req.Role, Attestor: "tpm", Csr: req.Csr, Tpm: &bcdv1.TPMAttestation{
				EkPublic: req.Tpm.EkPublic, EkCertificate: req.Tpm.EkCertificate, AkPublic: req.Tpm.AkPublic,
				KeyPublic: req.Tpm.KeyPublic, CertifyInfo: req.Tpm.CertifyInfo, CertifySignature: req.Tpm.CertifySignature,
			}}
			mod(r.Tpm)
			if _, err := call(cl, r); connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Errorf("%s: %v, want PermissionDenied", name, err)
			}
		}
	})

	t.Run("AK of another TPM", func(t *testing.T) {
		// The enrolled EK, but the AK and key of another TPM: the
		// challenge cannot be answered by either TPM.
		req, _ := tpmRequest(t, tp, other, other)
		resp, err := call(cl, req)
		if err != nil {
			t.Fatalf("first call: %v", err)
		}
		ch := resp.GetChallenge()
		if _, err := tp.ActivateCredential(ch.GetCredentialBlob(), ch.GetEncryptedSecret()); err == nil {
			t.Error("the EK's TPM activated a credential for another TPM's AK")
		}
		if _, err := other.ActivateCredential(ch.GetCredentialBlob(), ch.GetEncryptedSecret()); err == nil {
			t.Error("another TPM activated a credential made for this EK")
		}
	})

	t.Run("unknown challenge, at most 3 rounds", func(t *testing.T) {
		req, _ := tpmRequest(t, tp, tp, tp)
		for round := int32(1); round <= 3; round++ {
			resp, err := call(cl, req)
			if err != nil || resp.GetChallenge().GetRound() != round {
				t.Fatalf("round %d: %v %v", round, err, resp)
			}
			req.Tpm.ChallengeId, req.Tpm.ChallengeAnswer = "tc_unknown", []byte("x")
		}
		if _, err := call(cl, req); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "3 TPM challenges") {
			t.Fatalf("a fourth round: %v, want PermissionDenied", err)
		}
	})

	t.Run("token attestor fields are refused", func(t *testing.T) {
		req, _ := tpmRequest(t, tp, tp, tp)
		req.SealedToken = "x"
		if _, err := call(cl, req); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("tpm join with a sealed token: %v", err)
		}
		req.SealedToken, req.Tpm = "", nil
		if _, err := call(cl, req); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("tpm join without evidence: %v", err)
		}
	})
}

// TestTPMJoinEKCA: a TPM whose EK certificate an enrolled EK CA issued joins
// without its EK being enrolled; another CA admits nothing.
func TestTPMJoinEKCA(t *testing.T) {
	state, caFile := swtpmtest.SetupEKCerts(t)
	g := startGateway(t, gateway.Config{})
	tp := newTPM(t, state)
	if _, cert, err := tp.EK(); err != nil || cert == nil {
		t.Fatalf("swtpm_setup made no EK certificate: %v", err)
	}
	otherCA, err := pki.NewCA("not the EK CA", 0x7fffffffffffffff)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.s.EnrollTPM(adminapi.TPMEnrollRequest{EKCA: otherCA.CertPEM(), Site: "rack2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := join.Join(context.Background(), tpmJoinOpts(g, g.client(t, nil), tp, t.TempDir())); err == nil || !strings.Contains(err.Error(), "not from an enrolled EK CA") {
		t.Fatalf("join under another EK CA: %v", err)
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.s.EnrollTPM(adminapi.TPMEnrollRequest{EKCA: ca, Site: "rack2"}); err != nil {
		t.Fatal(err)
	}
	a, err := join.Join(context.Background(), tpmJoinOpts(g, g.client(t, nil), tp, t.TempDir()))
	if err != nil {
		t.Fatalf("join under the enrolled EK CA: %v", err)
	}
	if a.Site != "rack2" {
		t.Errorf("site %s, want rack2 (the EK CA's enrolment)", a.Site)
	}
}

// TestTPMRenewal: a tpm-joined node's renewal is certified by the AK and the
// new certificate names it again; a renewal without the certification, or
// certified for another key, is refused.
func TestTPMRenewal(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	tp := newTPM(t, "")
	enrollEK(t, g, tp)
	dir := t.TempDir()
	a, err := join.Join(context.Background(), tpmJoinOpts(g, g.client(t, nil), tp, dir))
	if err != nil {
		t.Fatal(err)
	}
	cl := g.client(t, certOf(a))

	t.Run("without certification", func(t *testing.T) {
		key, _ := tp.NewNodeKey()
		csr, _ := pki.CreateCSR(key, a.NodeID)
		proof, _ := pki.Sign(a.Key, pki.PurposeRenew, csr)
		_, err := cl.Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: csr, Proof: proof}))
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "AK's certification") {
			t.Fatalf("renewal without certification: %v", err)
		}
	})
	t.Run("certification of another key", func(t *testing.T) {
		key, _ := tp.NewNodeKey()
		csr, _ := pki.CreateCSR(key, a.NodeID)
		proof, _ := pki.Sign(a.Key, pki.PurposeRenew, csr)
		otherKey, _ := tp.NewNodeKey()
		kp, at, sg, err := tp.Certify(otherKey, sha256.Sum256(csr))
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: csr, Proof: proof,
			Certification: &bcdv1.TPMCertification{KeyPublic: kp, CertifyInfo: at, CertifySignature: sg}}))
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("renewal certified for another key: %v", err)
		}
		// The right key, certified over another CSR.
		kp, at, sg, _ = tp.Certify(key, sha256.Sum256([]byte("another csr")))
		_, err = cl.Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: csr, Proof: proof,
			Certification: &bcdv1.TPMCertification{KeyPublic: kp, CertifyInfo: at, CertifySignature: sg}}))
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("renewal certified over another CSR: %v", err)
		}
	})
	t.Run("without the TPM", func(t *testing.T) {
		_, err := renew.Once(context.Background(), renew.Config{Client: cl, DataDir: dir, SigningPin: g.pins.JoinSigning}, a)
		if err == nil || !strings.Contains(err.Error(), "the TPM is not open") {
			t.Fatalf("renewal of a TPM node without its TPM: %v", err)
		}
	})
	t.Run("under another TPM's AK", func(t *testing.T) {
		_, err := renew.Once(context.Background(), renew.Config{Client: cl, DataDir: dir, SigningPin: g.pins.JoinSigning, TPM: newTPM(t, "")}, a)
		if err == nil || !strings.Contains(err.Error(), "not the AK this node's certificate names") {
			t.Fatalf("renewal with another TPM: %v", err)
		}
	})

	next, err := renew.Once(context.Background(), renew.Config{Client: cl, DataDir: dir, SigningPin: g.pins.JoinSigning, TPM: tp}, a)
	if err != nil {
		t.Fatalf("renewal certified by the AK: %v", err)
	}
	want, _ := identity.CertAK(a.Cert)
	if got, _ := identity.CertAK(next.Cert); !bytes.Equal(got, want) || next.KeyHolder != identity.KeyInTPM {
		t.Errorf("renewed certificate names AK %x, holder %q; want %x in the TPM", got, next.KeyHolder, want)
	}
	if next.Cert.SerialNumber.Cmp(a.Cert.SerialNumber) == 0 {
		t.Error("the renewal kept the certificate")
	}
	loaded, err := identity.LoadWith(dir, tp)
	if err != nil || !loaded.Cert.Equal(next.Cert) {
		t.Fatalf("the renewed identity does not load: %v", err)
	}
	if c := strings.Count(g.logs.String(), `"msg":"node renewed"`); c != 1 {
		t.Errorf("%d renewals logged, want 1", c)
	}
}

// TestFileKeyMovesIntoTPM: a token-joined node with a file key renews with
// a TPM: the next key is made in the TPM and node.key records it.
func TestFileKeyMovesIntoTPM(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	tp := newTPM(t, "")
	dir := t.TempDir()
	a, err := join.Join(context.Background(), joinOpts(g, g.client(t, nil), g.token(t, "node", 1), dir))
	if err != nil {
		t.Fatal(err)
	}
	if a.KeyHolder != identity.KeyInFile {
		t.Fatalf("token join holder %q, want a file", a.KeyHolder)
	}
	next, err := renew.Once(context.Background(), renew.Config{Client: g.client(t, certOf(a)), DataDir: dir, SigningPin: g.pins.JoinSigning, TPM: tp}, a)
	if err != nil {
		t.Fatalf("renewal with a TPM: %v", err)
	}
	if next.KeyHolder != identity.KeyInTPM {
		t.Fatalf("after renewal the key is in %q, want the TPM", next.KeyHolder)
	}
	raw, _ := os.ReadFile(dir + "/" + identity.KeyFile)
	if strings.Contains(string(raw), "PRIVATE KEY") || !strings.Contains(string(raw), `"tpm"`) {
		t.Fatalf("node.key after the move: %q", raw)
	}
	loaded, err := identity.LoadWith(dir, tp)
	if err != nil || loaded.KeyHolder != identity.KeyInTPM || !loaded.Cert.Equal(next.Cert) {
		t.Fatalf("load after the move: %v", err)
	}
	// The node key in the TPM opens a session (mTLS through the TPM).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, f, err := openSession(t, ctx, g.client(t, certOf(loaded)), a.NodeID); err != nil || f.GetWelcome() == nil {
		t.Fatalf("session with the TPM key: %v %v", err, f)
	}
	if ak, _ := identity.CertAK(next.Cert); ak != nil {
		t.Error("a token-joined node's certificate names an AK after moving into the TPM")
	}
}
