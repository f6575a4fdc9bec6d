package join

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/base/backoff"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// MaxTPMRounds is how many credential activation challenges a tpm join
// answers before it gives up.
const MaxTPMRounds = 3

// TPM is what a tpm join needs of the host's TPM (components/trust/tpm/nodetpm
// implements it).
type TPM interface {
	identity.TPM
	// NewNodeKey makes a node key under a new unique.
	NewNodeKey() (crypto.Signer, error)
	// AKPublic answers the AK's TPMT_PUBLIC.
	AKPublic() ([]byte, error)
	// Certify has the AK certify key over qualifyingData: the key's
	// TPMT_PUBLIC, the TPMS_ATTEST and the AK's TPMT_SIGNATURE.
	Certify(key crypto.Signer, qualifyingData [32]byte) (keyPub, attest, sig []byte, err error)
	// EK answers the EK's TPMT_PUBLIC and its certificate (nil if none).
	EK() (pub, cert []byte, err error)
	// ActivateCredential recovers a challenge's secret.
	ActivateCredential(credBlob, encSecret []byte) ([]byte, error)
}

// joinTPM is a join with the tpm attestor: no token; the join key is made in
// the TPM and certified by the AK over sha256(csr); the gateway checks the
// EK and asks the TPM to prove, by credential activation, that the AK is
// there (up to MaxTPMRounds challenges); the certificate names the AK.
func joinTPM(ctx context.Context, o Options) (*identity.Agent, error) {
	t := o.TPM
	if t == nil {
		return nil, errors.New("join with the tpm attestor: no TPM")
	}
	key, err := t.NewNodeKey()
	if err != nil {
		return nil, fmt.Errorf("make the join key in the TPM: %w", err)
	}
	csr, err := pki.CreateCSR(key, o.Claims.GetHostname())
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(csr)
	keyPub, attest, sig, err := t.Certify(key, sum)
	if err != nil {
		return nil, fmt.Errorf("certify the join key with the AK: %w", err)
	}
	akPub, err := t.AKPublic()
	if err != nil {
		return nil, err
	}
	ekPub, ekCert, err := t.EK()
	if err != nil {
		return nil, err
	}
	ev := &bcdv1.TPMAttestation{
		EkPublic: ekPub, EkCertificate: ekCert, AkPublic: akPub, KeyPublic: keyPub,
		CertifyInfo: attest, CertifySignature: sig,
	}
	req := &bcdv1.JoinRequest{Role: o.Role, Attestor: "tpm", Csr: csr, Claims: o.Claims, Tpm: ev}
	rounds := 0
	for attempt := 0; ; {
		resp, err := o.Client.Join(ctx, connect.NewRequest(req))
		if err != nil {
			if !Retryable(err) || attempt+1 >= o.MaxAttempts {
				if c := connect.CodeOf(err); c == connect.CodePermissionDenied || c == connect.CodeInvalidArgument {
					return nil, fmt.Errorf("Join refused: %s", connectMessage(err))
				}
				return nil, fmt.Errorf("Join: %w", err)
			}
			// The answer may have been taken: answer a new challenge
			// rather than send the same answer twice (a replay).
			ev.ChallengeId, ev.ChallengeAnswer = "", nil
			wait, ok := backoff.Pushback(err)
			if !ok {
				wait = backoff.Full(attempt, 500*time.Millisecond, 30*time.Second)
			}
			o.Log.Warn("join failed; retrying", "attempt", attempt+1, "retry_in", wait.String(), "err", connectMessage(err))
			if err := o.Sleep(ctx, wait); err != nil {
				return nil, err
			}
			attempt++
			continue
		}
		ch := resp.Msg.GetChallenge()
		if ch == nil {
			return saveTPMJoin(o, resp.Msg, csr, key, akPub)
		}
		rounds++
		if rounds > MaxTPMRounds {
			return nil, fmt.Errorf("Join: the gateway asked more than %d TPM challenges", MaxTPMRounds)
		}
		o.Log.Info("answering the gateway's TPM challenge", "challenge", ch.GetId(), "round", rounds)
		secret, err := t.ActivateCredential(ch.GetCredentialBlob(), ch.GetEncryptedSecret())
		if err != nil {
			return nil, err
		}
		ev.ChallengeId, ev.ChallengeAnswer = ch.GetId(), secret
	}
}

// saveTPMJoin verifies the answer like any join's, checks that the
// certificate names this TPM's AK, and stores the identity (node.key then
// records the key's unique).
func saveTPMJoin(o Options, r *bcdv1.JoinResponse, csr []byte, key crypto.Signer, akPub []byte) (*identity.Agent, error) {
	res, cert, err := VerifyResponse(r, o.SigningPin, csr, key.Public(), o.Role)
	if err != nil {
		return nil, err
	}
	got, err := identity.CertAK(cert)
	if err != nil {
		return nil, fmt.Errorf("JoinResponse: %w", err)
	}
	if want := AKName(akPub); !bytes.Equal(got, want) {
		return nil, errors.New("JoinResponse: the certificate does not name this TPM's AK")
	}
	if err := o.record(r, res.GetNodeId()); err != nil {
		return nil, err
	}
	return identity.Save(o.DataDir, key, cert, identity.Identity{
		NodeID: res.GetNodeId(), Site: res.GetSite(), Role: res.GetRole(), SPIFFEID: res.GetSpiffeId(), JoinedAt: o.Now().UTC(),
	})
}

// AKName is the TPM name of a bcd AK (its name algorithm is SHA-256): 0x000b
// and the SHA-256 of its TPMT_PUBLIC.
func AKName(akPub []byte) []byte {
	d := sha256.Sum256(akPub)
	return append([]byte{0x00, 0x0b}, d[:]...)
}
