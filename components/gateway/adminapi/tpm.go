package adminapi

import (
	"context"
	"net/http"
)

// TPMEnrollRequest enrols an EK public key or an EK CA for a site.
type TPMEnrollRequest struct {
	// EKPublic is the EK's public key: PEM or DER SubjectPublicKeyInfo, or
	// its TPMT_PUBLIC.
	EKPublic []byte `json:"ek_public,omitempty"`
	// EKPin is the EK's SPKI pin (sha256/...), as a refused tpm join names
	// it; compare it with one read on the machine itself.
	EKPin string `json:"ek_pin,omitempty"`
	// EKCA is an EK CA's certificate(s), PEM or DER.
	EKCA []byte `json:"ek_ca,omitempty"`
	Site string `json:"site"`
	Role string `json:"role,omitempty"` // node (default) or site
}

// TPMEnrollResponse says what was enrolled.
type TPMEnrollResponse struct {
	EK   string `json:"ek,omitempty"`    // the EK's SPKI pin
	EKCA string `json:"ek_ca,omitempty"` // the CA's subject
	Site string `json:"site"`
	Role string `json:"role"`
}

// EnrollTPM enrols an EK public key or an EK CA.
func (c *Client) EnrollTPM(ctx context.Context, r TPMEnrollRequest) (TPMEnrollResponse, error) {
	var out TPMEnrollResponse
	return out, c.do(ctx, http.MethodPost, "/v1/tpm/enroll", r, &out)
}
