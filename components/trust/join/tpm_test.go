package join_test

import (
	"context"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm/ek"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// tpmGateway plays a gateway's tpm attestor: it challenges with a real
// credential (ek.MakeCredential) until it has challenged `rounds` times,
// checks the answer, and then answers a certificate that names the AK
// unless noAK. failAnswer fails the first answered call as unavailable.
type tpmGateway struct {
	bcdv1connect.AgentGatewayClient
	t          *testing.T
	is         *issuer
	rounds     int
	noAK       bool
	failAnswer bool

	mu      sync.Mutex
	reqs    []*bcdv1.JoinRequest
	secret  []byte
	asked   int
	failed  bool
	answers int
}

func (g *tpmGateway) Join(ctx context.Context, req *connect.Request[bcdv1.JoinRequest]) (*connect.Response[bcdv1.JoinResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := req.Msg
	g.reqs = append(g.reqs, proto.Clone(m).(*bcdv1.JoinRequest))
	a := m.GetTpm()
	if m.GetAttestor() != "tpm" || m.GetSealedToken() != "" || a == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("not a tpm join"))
	}
	if a.GetChallengeId() != "" {
		if g.failAnswer && !g.failed {
			g.failed = true
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("lost"))
		}
		if string(a.GetChallengeAnswer()) != string(g.secret) {
			return nil, connect.NewError(connect.CodePermissionDenied, errors.New("wrong answer"))
		}
		g.answers++
		if g.asked >= g.rounds {
			csr, err := pki.ParseCSR(m.GetCsr())
			if err != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, err)
			}
			var ext []pkix.Extension
			if !g.noAK {
				v, _ := asn1.Marshal(join.AKName(a.GetAkPublic()))
				ext = []pkix.Extension{{Id: identity.OIDTPMAK, Value: v}}
			}
			spiffe := pki.SPIFFEID("bcgw.lab", "node", "node_tpm")
			cert, err := g.is.ca.IssueClient(csr.PublicKey, "node_tpm", spiffe, "lab", time.Hour, ext...)
			if err != nil {
				g.t.Fatal(err)
			}
			r := g.is.result(g.t, "node_tpm", "node", m.GetCsr(), csr.PublicKey)
			r.Certificate = cert.Raw
			return connect.NewResponse(g.is.respond(g.t, r, g.is.sign, pki.PurposeJoinResponse)), nil
		}
	}
	g.secret = []byte("challenge secret of 32 bytes....")
	blob, enc, err := ek.MakeCredential(a.GetEkPublic(), a.GetAkPublic(), g.secret)
	if err != nil {
		return nil, connect.NewError(connect.CodePermissionDenied, err)
	}
	g.asked++
	return connect.NewResponse(&bcdv1.JoinResponse{Challenge: &bcdv1.TPMChallenge{
		Id: "tc_" + string(rune('a'+g.asked)), CredentialBlob: blob, EncryptedSecret: enc, Round: int32(g.asked)}}), nil
}

func tpmOpts(t *testing.T, g *tpmGateway, dir string) join.Options {
	t.Helper()
	sw := swtpmtest.Start(t, "")
	tp, err := nodetpm.OpenTCP(sw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	sl := &sleeps{}
	return join.Options{
		Client: g, Role: "node", Attestor: "tpm", TPM: tp, SigningPin: g.is.pin,
		Claims: &bcdv1.HardwareClaims{Hostname: "h1"}, DataDir: dir, Sleep: sl.sleep,
	}
}

func TestTPMJoinClient(t *testing.T) {
	for _, tc := range []struct {
		name       string
		g          *tpmGateway
		want       string // error substring, "" for success
		wantCalls  int
		wantAnswer int
	}{
		{"one round", &tpmGateway{rounds: 1}, "", 2, 1},
		{"three rounds", &tpmGateway{rounds: 3}, "", 4, 3},
		{"a fourth challenge is refused", &tpmGateway{rounds: 4}, "more than 3 TPM challenges", 4, 3},
		{"a certificate without the AK", &tpmGateway{rounds: 1, noAK: true}, "does not name this TPM's AK", 2, 1},
		{"a lost answer is not sent again", &tpmGateway{rounds: 1, failAnswer: true}, "", 4, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.g
			g.t, g.is = t, newIssuer(t)
			dir := t.TempDir()
			a, err := join.Join(context.Background(), tpmOpts(t, g, dir))
			if tc.want == "" && err != nil {
				t.Fatalf("join: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("join: %v, want %q", err, tc.want)
			}
			if len(g.reqs) != tc.wantCalls || g.answers != tc.wantAnswer {
				t.Errorf("%d calls, %d accepted answers; want %d, %d", len(g.reqs), g.answers, tc.wantCalls, tc.wantAnswer)
			}
			// No request carries a token, and every one the same evidence.
			for i, r := range g.reqs {
				if r.GetSealedToken() != "" || string(r.GetCsr()) != string(g.reqs[0].GetCsr()) {
					t.Errorf("request %d carries a token or another CSR", i)
				}
			}
			if tc.g.failAnswer && g.reqs[2].GetTpm().GetChallengeId() != "" {
				t.Error("after a lost answer the same answer was sent again")
			}
			if tc.want != "" {
				if _, err := identity.Load(dir); !errors.Is(err, identity.ErrNotJoined) {
					t.Errorf("a refused tpm join stored an identity: %v", err)
				}
				return
			}
			if a.KeyHolder != identity.KeyInTPM {
				t.Errorf("key holder %q", a.KeyHolder)
			}
		})
	}
}
