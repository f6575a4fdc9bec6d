package helperclient

import (
	"context"
	"errors"
	"strings"

	"github.com/better-compute/bcd/components/helper/wire"
)

// The tpm.* calls answer the helper's bytes as they came, after only the
// wire's shape checks (sizes, the answer's fields): what they say (a node
// key's attributes, a signature, a certification) is for the caller to
// check, as components/helper/helpertpm does.

// TPMNodeKey asks the helper to derive the node key named by unique (32
// bytes) and answers its TPMT_PUBLIC.
func (c *Client) TPMNodeKey(ctx context.Context, unique []byte) ([]byte, error) {
	resp, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpTPMNodeKey, Unique: unique})
	if err != nil {
		return nil, err
	}
	return resp.Public, nil
}

// TPMSign asks the helper to sign digest (32, 48 or 64 bytes) with the node
// key of unique, which tpm.nodekey must have loaded; answers ASN.1 DER
// ECDSA.
func (c *Client) TPMSign(ctx context.Context, unique, digest []byte) ([]byte, error) {
	resp, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpTPMSign, Unique: unique, Digest: digest})
	if err != nil {
		return nil, err
	}
	return resp.Signature, nil
}

// TPMAK answers the TPMT_PUBLIC of the helper's AK.
func (c *Client) TPMAK(ctx context.Context) ([]byte, error) {
	resp, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpTPMAK})
	if err != nil {
		return nil, err
	}
	return resp.AKPublic, nil
}

// TPMCertify asks the helper to have its AK certify the node key of unique
// over qualifyingData (32 bytes); answers the TPMS_ATTEST, the AK's
// TPMT_SIGNATURE and the AK's TPMT_PUBLIC.
func (c *Client) TPMCertify(ctx context.Context, unique, qualifyingData []byte) (attest, sig, akPub []byte, err error) {
	resp, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpTPMCertify, Unique: unique, QualifyingData: qualifyingData})
	if err != nil {
		return nil, nil, nil, err
	}
	return resp.Attest, resp.Signature, resp.AKPublic, nil
}

// TPMRelease asks the helper to unload the node key of unique.
func (c *Client) TPMRelease(ctx context.Context, unique []byte) error {
	_, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpTPMRelease, Unique: unique})
	return err
}

// IsNotLoaded reports whether err is the helper refusing a tpm.* call for a
// key it holds none of (wire.NotLoaded): tpm.nodekey loads it again.
func IsNotLoaded(err error) bool {
	var e *Error
	return errors.As(err, &e) && strings.Contains(e.Msg, wire.NotLoaded)
}

// IsNoTPM reports whether err is the helper saying its host has no TPM.
func IsNoTPM(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Msg == wire.NoTPM
}
