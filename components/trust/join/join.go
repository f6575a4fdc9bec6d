// Package join admits this machine to the fleet: it seals the join token
// to the pinned JoinService key, sends a CSR for a new key, verifies the
// signed JoinResponse against the pinned signing key and stores the
// identity. Retryable failures retry with full-jitter back-off, or exactly
// when the gateway's grpc-retry-pushback-ms says.
package join

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/base/backoff"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/rootsig"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// Options are the inputs of one join.
type Options struct {
	Client    bcdv1connect.AgentGatewayClient
	Role      string
	Attestor  string // default join-token
	Assertion string // the site's discovery assertion (attestor discovery)
	TPM       TPM    // the host's TPM (attestor tpm; see tpm.go)
	// CloudIID is an EC2 instance's identity document and signature
	// (attestor cloud-iid, no token), read once from IMDSv2.
	CloudIID      *bcdv1.CloudIdentity
	Token         string
	EncryptionJWK *jose.JSONWebKey // already checked against join_encryption_key_pin
	SigningPin    string           // join_signing_key_pin
	Claims        *bcdv1.HardwareClaims
	DataDir       string
	// NodeID, with the provisioned attestor, is the node the installed OS
	// must join as: a JoinResponse for another node is refused before
	// anything is stored.
	NodeID      string
	MaxAttempts int // default 20
	Log         *slog.Logger
	// Sleep waits between attempts; tests shorten it.
	Sleep func(ctx context.Context, d time.Duration) error
	Now   func() time.Time
	// Verified, when set, is given the JoinResponse once it verified and
	// before the identity is stored, as the record bcd helper binds to
	// (bcd join as root keeps it in root's directory).
	Verified func(rootsig.JoinRecord) error
}

// record hands the verified response to o.Verified.
func (o Options) record(r *bcdv1.JoinResponse, nodeID string) error {
	if o.Verified == nil {
		return nil
	}
	return o.Verified(rootsig.JoinRecord{V: 1, NodeID: nodeID, Result: r.GetResult(), Signature: r.GetSignature(), SigningKey: r.GetSigningKey()})
}

// MaxPushbacks bounds the refusals with a pushback one join waits out.
const MaxPushbacks = 1000

// Retryable reports whether an RPC error is worth another attempt.
func Retryable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeResourceExhausted, connect.CodeDeadlineExceeded, connect.CodeAborted:
		return true
	case connect.CodeUnknown:
		// Transport errors (connection refused, reset) surface as Unknown or
		// Unavailable depending on where they happen.
		var ce *connect.Error
		return !errors.As(err, &ce) || ce.Code() == connect.CodeUnavailable
	}
	return false
}

// Join runs the join and returns the stored identity.
func Join(ctx context.Context, o Options) (*identity.Agent, error) {
	if o.MaxAttempts == 0 {
		o.MaxAttempts = 20
	}
	if o.Sleep == nil {
		o.Sleep = backoff.Sleep
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Attestor == "" {
		o.Attestor = "join-token"
	}
	if o.Attestor == "tpm" {
		return joinTPM(ctx, o)
	}
	key, err := pki.GenerateKey()
	if err != nil {
		return nil, err
	}
	csr, err := pki.CreateCSR(key, o.Claims.GetHostname())
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(csr)
	req := &bcdv1.JoinRequest{Role: o.Role, Attestor: o.Attestor, Csr: csr, Claims: o.Claims, Assertion: o.Assertion, CloudIid: o.CloudIID}
	var resp *connect.Response[bcdv1.JoinResponse]
	// A refusal with a pushback (the gateway's join limiter, its session
	// limit) is the gateway saying when to come back, not a failure: it is
	// not counted as an attempt, up to MaxPushbacks of them.
	pushbacks := 0
	for attempt := 0; ; attempt++ {
		// Sealed anew for each attempt, so its issue time stays fresh
		// however long the back-off was.
		if o.CloudIID == nil {
			req.SealedToken, err = pki.SealToken(o.EncryptionJWK, pki.SealedToken{Token: o.Token, CSRSHA256: fmt.Sprintf("%x", sum), IssuedAt: o.Now().Unix()})
			if err != nil {
				return nil, fmt.Errorf("seal join token: %w", err)
			}
		}
		resp, err = o.Client.Join(ctx, connect.NewRequest(req))
		if err == nil {
			break
		}
		wait, pushed := backoff.Pushback(err)
		if pushed && Retryable(err) && pushbacks < MaxPushbacks {
			pushbacks++
			attempt--
			// Plus up to half again: those refused together come back apart.
			wait = backoff.Jitter(wait)
		} else if !Retryable(err) || attempt+1 >= o.MaxAttempts {
			if connect.CodeOf(err) == connect.CodePermissionDenied || connect.CodeOf(err) == connect.CodeInvalidArgument {
				if o.CloudIID != nil && attempt > 0 {
					// The gateway admits each instance once: a lost answer
					// may have admitted this one.
					return nil, fmt.Errorf("Join refused: %s (an earlier attempt may have admitted this instance: check for its node, or join again with --reset and a join token)", connectMessage(err))
				}
				return nil, fmt.Errorf("Join refused: %s", connectMessage(err))
			}
			return nil, fmt.Errorf("Join: %w", err)
		}
		if !pushed {
			wait = backoff.Full(attempt, 500*time.Millisecond, 30*time.Second)
		}
		if pushed {
			o.Log.Info("join deferred by the gateway; retrying", "pushbacks", pushbacks, "retry_in", wait.String(), "err", connectMessage(err))
		} else {
			o.Log.Warn("join failed; retrying", "attempt", attempt+1, "retry_in", wait.String(), "err", connectMessage(err))
		}
		if err := o.Sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	res, cert, err := VerifyResponse(resp.Msg, o.SigningPin, csr, key.Public(), o.Role)
	if err != nil {
		return nil, err
	}
	if o.NodeID != "" && res.GetNodeId() != o.NodeID {
		return nil, fmt.Errorf("JoinResponse: joined as node %s, not --node-id %s", res.GetNodeId(), o.NodeID)
	}
	if err := o.record(resp.Msg, res.GetNodeId()); err != nil {
		return nil, err
	}
	return identity.Save(o.DataDir, key, cert, identity.Identity{
		NodeID: res.GetNodeId(), Site: res.GetSite(), Role: res.GetRole(), SPIFFEID: res.GetSpiffeId(), JoinedAt: o.Now().UTC(),
	})
}

func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// VerifyResponse checks a JoinResponse: the signing key matches its pin and
// signed the result for the join-response purpose, the result answers this
// CSR, the certificate is for this key, and its SPIFFE id and role are the
// ones asked for.
func VerifyResponse(r *bcdv1.JoinResponse, signingPin string, csr []byte, pub crypto.PublicKey, role string) (*bcdv1.JoinResult, *x509.Certificate, error) {
	spk, err := x509.ParsePKIXPublicKey(r.GetSigningKey())
	if err != nil {
		return nil, nil, fmt.Errorf("JoinResponse: signing key: %w", err)
	}
	if err := pki.MatchPin(signingPin, spk); err != nil {
		return nil, nil, fmt.Errorf("JoinResponse: signing key does not match join_signing_key_pin")
	}
	if err := pki.Verify(spk, pki.PurposeJoinResponse, r.GetResult(), r.GetSignature()); err != nil {
		return nil, nil, fmt.Errorf("JoinResponse: signature: %w", err)
	}
	var res bcdv1.JoinResult
	if err := proto.Unmarshal(r.GetResult(), &res); err != nil {
		return nil, nil, fmt.Errorf("JoinResponse: result: %w", err)
	}
	sum := sha256.Sum256(csr)
	if !bytes.Equal(res.GetCsrSha256(), sum[:]) {
		return nil, nil, errors.New("JoinResponse answers another CSR")
	}
	cert, err := x509.ParseCertificate(res.GetCertificate())
	if err != nil {
		return nil, nil, fmt.Errorf("JoinResponse: certificate: %w", err)
	}
	ep, ok1 := cert.PublicKey.(*ecdsa.PublicKey)
	mp, ok2 := pub.(*ecdsa.PublicKey)
	if !ok1 || !ok2 || !ep.Equal(mp) {
		return nil, nil, errors.New("JoinResponse: certificate is not for this node's key")
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != res.GetSpiffeId() {
		return nil, nil, errors.New("JoinResponse: certificate's SPIFFE id differs from the result's")
	}
	_, crole, cnode, err := pki.ParseSPIFFEID(cert.URIs[0])
	if err != nil {
		return nil, nil, fmt.Errorf("JoinResponse: %w", err)
	}
	if crole != role || res.GetRole() != role {
		return nil, nil, fmt.Errorf("JoinResponse: joined as role %q, asked for %q", res.GetRole(), role)
	}
	if cnode != res.GetNodeId() || res.GetNodeId() == "" {
		return nil, nil, errors.New("JoinResponse: certificate names another node")
	}
	return &res, cert, nil
}
