package join_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/base/backoff"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// issuer plays the gateway's JoinService: its signing key, node CA and
// join encryption key.
type issuer struct {
	sign *ecdsa.PrivateKey
	spki []byte
	pin  string
	ca   *pki.CA
	enc  *jose.JSONWebKey // private
	pub  *jose.JSONWebKey
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	k, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	pin, err := pki.Pin(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA("join test node CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := pki.GenerateEncryptionJWK()
	if err != nil {
		t.Fatal(err)
	}
	pub := pki.PublicJWK(enc)
	return &issuer{sign: k, spki: spki, pin: pin, ca: ca, enc: enc, pub: &pub}
}

// result is what a gateway answers: a certificate for certKey naming
// role/nodeID, and the result fields to match.
func (is *issuer) result(t *testing.T, nodeID, role string, csr []byte, certKey crypto.PublicKey) *bcdv1.JoinResult {
	t.Helper()
	spiffe := pki.SPIFFEID("bcgw.lab", role, nodeID)
	cert, err := is.ca.IssueClient(certKey, nodeID, spiffe, "lab", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(csr)
	return &bcdv1.JoinResult{
		NodeId: nodeID, Site: "lab", Role: role, SpiffeId: spiffe.String(), Certificate: cert.Raw,
		CsrSha256: sum[:], NotAfterUnix: cert.NotAfter.Unix(), ServerTimeUnixMs: time.Now().UnixMilli(),
	}
}

func (is *issuer) respond(t *testing.T, r *bcdv1.JoinResult, signer *ecdsa.PrivateKey, purpose string) *bcdv1.JoinResponse {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := pki.Sign(signer, purpose, b)
	if err != nil {
		t.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		t.Fatal(err)
	}
	return &bcdv1.JoinResponse{Result: b, Signature: sig, SigningKey: spki}
}

func newKeyCSR(t *testing.T) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	k, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(k, "host")
	if err != nil {
		t.Fatal(err)
	}
	return k, csr
}

func TestVerifyResponse(t *testing.T) {
	is := newIssuer(t)
	nodeKey, csr := newKeyCSR(t)
	otherKey, otherCSR := newKeyCSR(t)
	good := func() *bcdv1.JoinResult { return is.result(t, "node_a", "node", csr, nodeKey.Public()) }

	tests := []struct {
		name string
		resp func() *bcdv1.JoinResponse
		role string
		want string // error substring; "" for success
	}{
		{"good", func() *bcdv1.JoinResponse { return is.respond(t, good(), is.sign, pki.PurposeJoinResponse) }, "node", ""},
		{"good site", func() *bcdv1.JoinResponse {
			return is.respond(t, is.result(t, "site_a", "site", csr, nodeKey.Public()), is.sign, pki.PurposeJoinResponse)
		}, "site", ""},
		{"signing key does not match the pin", func() *bcdv1.JoinResponse {
			return is.respond(t, good(), otherKey, pki.PurposeJoinResponse)
		}, "node", "does not match join_signing_key_pin"},
		{"pinned key sent, other key signed", func() *bcdv1.JoinResponse {
			r := is.respond(t, good(), otherKey, pki.PurposeJoinResponse)
			r.SigningKey = is.spki
			return r
		}, "node", "signature"},
		{"signing key is not a key", func() *bcdv1.JoinResponse {
			r := is.respond(t, good(), is.sign, pki.PurposeJoinResponse)
			r.SigningKey = []byte("junk")
			return r
		}, "node", "signing key"},
		{"signature over a tampered result", func() *bcdv1.JoinResponse {
			r := is.respond(t, good(), is.sign, pki.PurposeJoinResponse)
			tampered := good()
			tampered.NodeId = "node_evil"
			b, _ := proto.Marshal(tampered)
			r.Result = b
			return r
		}, "node", "signature"},
		{"one flipped byte in the result", func() *bcdv1.JoinResponse {
			r := is.respond(t, good(), is.sign, pki.PurposeJoinResponse)
			r.Result = bytes.Clone(r.Result)
			r.Result[len(r.Result)/2] ^= 1
			return r
		}, "node", "signature"},
		{"signature with the renew purpose", func() *bcdv1.JoinResponse {
			return is.respond(t, good(), is.sign, pki.PurposeRenew)
		}, "node", "signature"},
		{"result for another CSR", func() *bcdv1.JoinResponse {
			r := good()
			sum := sha256.Sum256(otherCSR)
			r.CsrSha256 = sum[:]
			return is.respond(t, r, is.sign, pki.PurposeJoinResponse)
		}, "node", "answers another CSR"},
		{"certificate for another key", func() *bcdv1.JoinResponse {
			return is.respond(t, is.result(t, "node_a", "node", csr, otherKey.Public()), is.sign, pki.PurposeJoinResponse)
		}, "node", "not for this node's key"},
		{"certificate is not DER", func() *bcdv1.JoinResponse {
			r := good()
			r.Certificate = []byte("junk")
			return is.respond(t, r, is.sign, pki.PurposeJoinResponse)
		}, "node", "certificate"},
		{"SPIFFE id differs from the certificate's", func() *bcdv1.JoinResponse {
			r := good()
			r.SpiffeId = "spiffe://bcgw.lab/node/node_b"
			return is.respond(t, r, is.sign, pki.PurposeJoinResponse)
		}, "node", "SPIFFE id differs"},
		{"joined as site, asked for node", func() *bcdv1.JoinResponse {
			return is.respond(t, is.result(t, "node_a", "site", csr, nodeKey.Public()), is.sign, pki.PurposeJoinResponse)
		}, "node", `joined as role "site", asked for "node"`},
		{"result says site, certificate node", func() *bcdv1.JoinResponse {
			r := good()
			r.Role = "site"
			return is.respond(t, r, is.sign, pki.PurposeJoinResponse)
		}, "node", "joined as role"},
		{"result names another node", func() *bcdv1.JoinResponse {
			r := good()
			r.NodeId = "node_b"
			return is.respond(t, r, is.sign, pki.PurposeJoinResponse)
		}, "node", "another node"},
		{"empty response", func() *bcdv1.JoinResponse { return &bcdv1.JoinResponse{} }, "node", "signing key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, cert, err := join.VerifyResponse(tt.resp(), is.pin, csr, nodeKey.Public(), tt.role)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("VerifyResponse: %v", err)
				}
				if res.GetRole() != tt.role || !nodeKey.PublicKey.Equal(cert.PublicKey) || cert.URIs[0].String() != res.GetSpiffeId() {
					t.Fatalf("verified %v with certificate %v", res, cert.URIs)
				}
				return
			}
			if err == nil {
				t.Fatalf("VerifyResponse accepted it: %v", res)
			}
			if res != nil || cert != nil {
				t.Errorf("a refusal returned a result or certificate")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

// fakeGateway is an AgentGatewayClient whose Join fails with errs, in
// order, and then answers as a gateway would. The embedded interface is nil:
// any other RPC panics.
type fakeGateway struct {
	bcdv1connect.AgentGatewayClient
	t     *testing.T
	is    *issuer
	token string
	errs  []error
	// answer, when set, replaces the honest response.
	answer func(req *bcdv1.JoinRequest) *bcdv1.JoinResponse

	mu   sync.Mutex
	reqs []*bcdv1.JoinRequest
}

func (f *fakeGateway) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

func (f *fakeGateway) Join(ctx context.Context, req *connect.Request[bcdv1.JoinRequest]) (*connect.Response[bcdv1.JoinResponse], error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, proto.Clone(req.Msg).(*bcdv1.JoinRequest))
	n := len(f.reqs)
	f.mu.Unlock()
	if n <= len(f.errs) {
		return nil, f.errs[n-1]
	}
	m := req.Msg
	if m.GetRole() != "node" || m.GetAttestor() != "join-token" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("role %q attestor %q", m.GetRole(), m.GetAttestor()))
	}
	st, err := pki.OpenToken(f.is.enc, m.GetSealedToken())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	sum := sha256.Sum256(m.GetCsr())
	if st.Token != f.token || st.CSRSHA256 != fmt.Sprintf("%x", sum) {
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("token or CSR binding wrong"))
	}
	if f.answer != nil {
		return connect.NewResponse(f.answer(m)), nil
	}
	csr, err := pki.ParseCSR(m.GetCsr())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewResponse(f.is.respond(f.t, f.is.result(f.t, "node_fake", "node", m.GetCsr(), csr.PublicKey), f.is.sign, pki.PurposeJoinResponse)), nil
}

func unavailable() error {
	return connect.NewError(connect.CodeUnavailable, errors.New("gateway restarting"))
}

func withPushback(code connect.Code, ms string) error {
	err := connect.NewError(code, errors.New("busy"))
	err.Meta().Set("grpc-retry-pushback-ms", ms)
	return err
}

// sleeps records the waits Join asks for without waiting.
type sleeps struct {
	mu    sync.Mutex
	waits []time.Duration
	err   error
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waits = append(s.waits, d)
	return s.err
}

func opts(f *fakeGateway, sl *sleeps, dir string) join.Options {
	return join.Options{
		Client: f, Role: "node", Token: f.token, EncryptionJWK: f.is.pub, SigningPin: f.is.pin,
		Claims: &bcdv1.HardwareClaims{Hostname: "h1"}, DataDir: dir, Sleep: sl.sleep,
	}
}

func newFake(t *testing.T, errs ...error) *fakeGateway {
	return &fakeGateway{t: t, is: newIssuer(t), token: "bcjt_jtabc_s3cretpart", errs: errs}
}

func TestJoinRetriesThenSucceeds(t *testing.T) {
	f := newFake(t, unavailable(), unavailable())
	sl := &sleeps{}
	dir := t.TempDir()
	o := opts(f, sl, dir)
	// A clock a minute further on at every reading.
	clockStart := time.Now().Truncate(time.Second)
	var ticks int
	readings := map[int64]bool{}
	o.Now = func() time.Time {
		ticks++
		now := clockStart.Add(time.Duration(ticks-1) * time.Minute)
		readings[now.Unix()] = true
		return now
	}
	a, err := join.Join(context.Background(), o)
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	if f.calls() != 3 {
		t.Errorf("%d Join calls, want 3", f.calls())
	}
	if len(sl.waits) != 2 {
		t.Fatalf("waits %v, want 2", sl.waits)
	}
	// Full jitter on a 500 ms base: attempt n waits in (0, 500ms*2^n].
	for i, w := range sl.waits {
		if max := 500 * time.Millisecond << i; w <= 0 || w > max {
			t.Errorf("wait %d = %v, want in (0, %v]", i, w, max)
		}
	}
	// Every attempt sends the same CSR, with the token sealed anew so that
	// its issue time is the attempt's.
	for i, r := range f.reqs {
		if !bytes.Equal(r.GetCsr(), f.reqs[0].GetCsr()) {
			t.Errorf("attempt %d sent another CSR", i)
		}
		st, err := pki.OpenToken(f.is.enc, r.GetSealedToken())
		if err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		sum := sha256.Sum256(r.GetCsr())
		if st.Token != f.token || st.CSRSHA256 != fmt.Sprintf("%x", sum) || !readings[st.IssuedAt] {
			t.Errorf("attempt %d sealed %+v, want the token bound to the CSR at a time Now returned", i, st)
		}
		if i > 0 {
			prev, _ := pki.OpenToken(f.is.enc, f.reqs[i-1].GetSealedToken())
			if st.IssuedAt <= prev.IssuedAt {
				t.Errorf("attempt %d sealed at %d, not after attempt %d's %d: the token was not sealed anew", i, st.IssuedAt, i-1, prev.IssuedAt)
			}
		}
	}
	if csr, err := pki.ParseCSR(f.reqs[0].GetCsr()); err != nil || csr.Subject.CommonName != "h1" {
		t.Errorf("CSR %v %v, want common name h1", csr, err)
	}
	if f.reqs[0].GetClaims().GetHostname() != "h1" {
		t.Error("claims not sent")
	}
	got, err := identity.Load(dir)
	if err != nil || got.NodeID != "node_fake" || got.NodeID != a.NodeID || got.Role != "node" || !got.Cert.Equal(a.Cert) {
		t.Fatalf("stored identity %+v %v", got, err)
	}
}

func TestJoinHonoursPushback(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want time.Duration
	}{
		{"resource exhausted, 1500 ms", withPushback(connect.CodeResourceExhausted, "1500"), 1500 * time.Millisecond},
		{"unavailable, 7 ms", withPushback(connect.CodeUnavailable, "7"), 7 * time.Millisecond},
		{"zero", withPushback(connect.CodeUnavailable, "0"), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, tt.err)
			sl := &sleeps{}
			if _, err := join.Join(context.Background(), opts(f, sl, t.TempDir())); err != nil {
				t.Fatal(err)
			}
			// The pushback plus up to half again of jitter.
			if len(sl.waits) != 1 || sl.waits[0] < tt.want || sl.waits[0] > tt.want*3/2 {
				t.Fatalf("waits %v, want one in [%v, %v]", sl.waits, tt.want, tt.want*3/2)
			}
		})
	}
}

// TestJoinPushbacksAreNotAttempts: a join refused with a pushback more
// often than MaxAttempts still joins (the gateway said when to come back);
// the waits are spread, not all the pushback itself.
func TestJoinPushbacksAreNotAttempts(t *testing.T) {
	var errs []error
	for range 30 {
		errs = append(errs, withPushback(connect.CodeResourceExhausted, "1000"))
	}
	f := newFake(t, errs...)
	sl := &sleeps{}
	o := opts(f, sl, t.TempDir())
	o.MaxAttempts = 3
	if _, err := join.Join(context.Background(), o); err != nil {
		t.Fatalf("30 pushbacks with MaxAttempts 3: %v", err)
	}
	distinct := map[time.Duration]bool{}
	for _, w := range sl.waits {
		if w < time.Second || w > 1500*time.Millisecond {
			t.Fatalf("wait %v outside [1s, 1.5s]", w)
		}
		distinct[w] = true
	}
	if len(sl.waits) != 30 || len(distinct) < 10 {
		t.Fatalf("%d waits, %d distinct: the pushback is not jittered", len(sl.waits), len(distinct))
	}
	// Failures without a pushback still end the join after MaxAttempts.
	f = newFake(t, unavailable(), unavailable(), unavailable())
	o = opts(f, &sleeps{}, t.TempDir())
	o.MaxAttempts = 3
	if _, err := join.Join(context.Background(), o); err == nil {
		t.Fatal("three failures with MaxAttempts 3 joined")
	}
}

func TestJoinNotRetried(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		want   string // the whole error text
		prefix bool
	}{
		{"permission denied", connect.NewError(connect.CodePermissionDenied, errors.New("join token has no uses left")), "Join refused: join token has no uses left", false},
		{"invalid argument", connect.NewError(connect.CodeInvalidArgument, errors.New("role must be node or site")), "Join refused: role must be node or site", false},
		{"unauthenticated", connect.NewError(connect.CodeUnauthenticated, errors.New("nope")), "Join: ", true},
		{"internal", connect.NewError(connect.CodeInternal, errors.New("boom")), "Join: ", true},
		{"unimplemented", connect.NewError(connect.CodeUnimplemented, errors.New("attestor")), "Join: ", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, tt.err)
			sl := &sleeps{}
			dir := t.TempDir()
			_, err := join.Join(context.Background(), opts(f, sl, dir))
			if err == nil {
				t.Fatal("Join succeeded")
			}
			if tt.prefix && !strings.HasPrefix(err.Error(), tt.want) || !tt.prefix && err.Error() != tt.want {
				t.Errorf("err = %q, want %q", err, tt.want)
			}
			if tt.prefix && connect.CodeOf(err) != connect.CodeOf(tt.err) {
				t.Errorf("code %v lost, got %v", connect.CodeOf(tt.err), connect.CodeOf(err))
			}
			if f.calls() != 1 || len(sl.waits) != 0 {
				t.Errorf("%d calls, %d waits; want 1 and 0", f.calls(), len(sl.waits))
			}
			if _, err := identity.Load(dir); !errors.Is(err, identity.ErrNotJoined) {
				t.Errorf("a refused join stored an identity: %v", err)
			}
			if strings.Contains(err.Error(), f.token) || strings.Contains(err.Error(), "s3cretpart") {
				t.Error("the error holds the token")
			}
		})
	}
}

func TestJoinMaxAttempts(t *testing.T) {
	tests := []struct {
		max, wantCalls int
	}{
		{1, 1},
		{4, 4},
		{0, 20}, // the default
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.max), func(t *testing.T) {
			errs := make([]error, 50)
			for i := range errs {
				errs[i] = unavailable()
			}
			f := newFake(t, errs...)
			sl := &sleeps{}
			o := opts(f, sl, t.TempDir())
			o.MaxAttempts = tt.max
			_, err := join.Join(context.Background(), o)
			if connect.CodeOf(err) != connect.CodeUnavailable || !strings.HasPrefix(err.Error(), "Join: ") {
				t.Fatalf("err = %v, want the last Unavailable wrapped as Join: ...", err)
			}
			if f.calls() != tt.wantCalls || len(sl.waits) != tt.wantCalls-1 {
				t.Fatalf("%d calls and %d waits, want %d and %d", f.calls(), len(sl.waits), tt.wantCalls, tt.wantCalls-1)
			}
			for i, w := range sl.waits {
				if w <= 0 || w > 30*time.Second {
					t.Errorf("wait %d = %v, want in (0, 30s]", i, w)
				}
			}
		})
	}
}

func TestJoinSleepErrorStops(t *testing.T) {
	f := newFake(t, unavailable(), unavailable())
	sl := &sleeps{err: context.Canceled}
	_, err := join.Join(context.Background(), opts(f, sl, t.TempDir()))
	if !errors.Is(err, context.Canceled) || f.calls() != 1 {
		t.Fatalf("err = %v after %d calls, want context.Canceled after 1", err, f.calls())
	}
}

func TestJoinRefusesBadResponse(t *testing.T) {
	f := newFake(t)
	stranger, _ := pki.GenerateKey()
	f.answer = func(m *bcdv1.JoinRequest) *bcdv1.JoinResponse {
		csr, err := pki.ParseCSR(m.GetCsr())
		if err != nil {
			t.Error(err)
			return nil
		}
		return f.is.respond(t, f.is.result(t, "node_fake", "node", m.GetCsr(), csr.PublicKey), stranger, pki.PurposeJoinResponse)
	}
	dir := t.TempDir()
	_, err := join.Join(context.Background(), opts(f, &sleeps{}, dir))
	if err == nil || !strings.Contains(err.Error(), "join_signing_key_pin") {
		t.Fatalf("Join with a response signed by another key: %v", err)
	}
	if _, err := identity.Load(dir); !errors.Is(err, identity.ErrNotJoined) {
		t.Errorf("an unverified response was stored: %v", err)
	}
}

func TestBackoff(t *testing.T) {
	tests := []struct {
		base, max time.Duration
	}{
		{500 * time.Millisecond, 30 * time.Second},
		{time.Second, time.Minute},
		{time.Millisecond, time.Millisecond},
		{time.Nanosecond, 10 * time.Nanosecond},
		{time.Hour, 2 * time.Hour},
		{time.Duration(1) << 62, time.Minute}, // base << n overflows
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/%v", tt.base, tt.max), func(t *testing.T) {
			for n := range 40 {
				cap := tt.max
				if n < 20 && tt.base <= tt.max>>n {
					cap = min(tt.max, tt.base<<n)
				}
				distinct := map[time.Duration]bool{}
				for range 200 {
					d := backoff.Full(n, tt.base, tt.max)
					if d <= 0 || d > cap {
						t.Fatalf("Backoff(%d) = %v, want in (0, %v]", n, d, cap)
					}
					distinct[d] = true
				}
				if cap >= time.Microsecond && len(distinct) < 10 {
					t.Fatalf("Backoff(%d) took only %d values in 200 draws: not jittered", n, len(distinct))
				}
			}
		})
	}
}

func TestPushback(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want time.Duration
		ok   bool
	}{
		{"250 ms", withPushback(connect.CodeResourceExhausted, "250"), 250 * time.Millisecond, true},
		{"zero", withPushback(connect.CodeUnavailable, "0"), 0, true},
		{"one hour", withPushback(connect.CodeUnavailable, "3600000"), time.Hour, true},
		{"over an hour", withPushback(connect.CodeUnavailable, "3600001"), 0, false},
		{"negative", withPushback(connect.CodeUnavailable, "-5"), 0, false},
		{"not a number", withPushback(connect.CodeUnavailable, "soon"), 0, false},
		{"absent", unavailable(), 0, false},
		{"wrapped", fmt.Errorf("dial: %w", withPushback(connect.CodeUnavailable, "42")), 42 * time.Millisecond, true},
		{"not a connect error", errors.New("plain"), 0, false},
		{"nil", nil, 0, false},
	}
	for _, tt := range tests {
		d, ok := backoff.Pushback(tt.err)
		if d != tt.want || ok != tt.ok {
			t.Errorf("%s: Pushback = %v %v, want %v %v", tt.name, d, ok, tt.want, tt.ok)
		}
	}
}

func TestRetryable(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"unavailable", unavailable(), true},
		{"resource exhausted", connect.NewError(connect.CodeResourceExhausted, nil), true},
		{"deadline exceeded", connect.NewError(connect.CodeDeadlineExceeded, nil), true},
		{"aborted", connect.NewError(connect.CodeAborted, nil), true},
		{"plain transport error", io.ErrUnexpectedEOF, true},
		{"connect unknown", connect.NewError(connect.CodeUnknown, nil), false},
		{"permission denied", connect.NewError(connect.CodePermissionDenied, nil), false},
		{"invalid argument", connect.NewError(connect.CodeInvalidArgument, nil), false},
		{"unauthenticated", connect.NewError(connect.CodeUnauthenticated, nil), false},
		{"canceled", connect.NewError(connect.CodeCanceled, nil), false},
		{"internal", connect.NewError(connect.CodeInternal, nil), false},
	}
	for _, tt := range tests {
		if got := join.Retryable(tt.err); got != tt.want {
			t.Errorf("%s: Retryable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestSleepCtx(t *testing.T) {
	if err := backoff.Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := backoff.Sleep(ctx, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("SleepCtx on a canceled context: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("SleepCtx waited despite the canceled context")
	}
}
