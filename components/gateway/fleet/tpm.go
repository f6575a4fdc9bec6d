package fleet

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm/ek"
	"github.com/better-compute/bcd/components/trust/tpm/ekcert"
)

// Where TPM enrolments are kept in the store's meta, and the role a tpm
// join gets when its enrolment names none.
const (
	metaEKPrefix   = "tpm/ek/"
	metaEKCAs      = "tpm/ekcas"
	tpmRoleDefault = "node"
)

// TPMEnrolment is what an enrolled EK or EK CA admits to.
type TPMEnrolment struct {
	Site       string    `json:"site"`
	Role       string    `json:"role"`
	EnrolledAt time.Time `json:"enrolled_at"`
	// CAPEM is an EK CA's certificate (PEM); empty for an enrolled EK.
	CAPEM string `json:"ca_pem,omitempty"`
}

// CheckEK finds what admits this EK: its enrolment, else an enrolled EK CA
// that issued its certificate. It answers the enrolment and the EK's pin.
func (s *Fleet) CheckEK(ekPub, ekCert []byte) (TPMEnrolment, string, error) {
	key, err := ek.PublicKey(ekPub)
	if err != nil {
		return TPMEnrolment{}, "", err
	}
	pin, err := pki.Pin(key)
	if err != nil {
		return TPMEnrolment{}, "", err
	}
	if b, err := s.store.Meta(metaEKPrefix + pin); err != nil {
		return TPMEnrolment{}, pin, err
	} else if len(b) > 0 {
		var e TPMEnrolment
		if err := json.Unmarshal(b, &e); err != nil {
			return TPMEnrolment{}, pin, fmt.Errorf("EK enrolment: %w", err)
		}
		return e, pin, nil
	}
	cas, err := s.ekCAs()
	if err != nil {
		return TPMEnrolment{}, pin, err
	}
	if len(ekCert) == 0 || len(cas) == 0 {
		return TPMEnrolment{}, pin, fmt.Errorf("the TPM's EK %s is not enrolled (bcgw tpm enroll --ek-pub) and %s", pin, map[bool]string{
			true: "it has no EK certificate", false: "no EK CA is enrolled (bcgw tpm enroll --ek-ca)"}[len(ekCert) == 0])
	}
	var errs []error
	for _, ca := range cas {
		roots := x509.NewCertPool()
		for _, c := range mustParseCerts(ca.CAPEM) {
			roots.AddCert(c)
		}
		err := ekcert.Verify(ekCert, ekPub, roots, nil)
		if err == nil {
			return ca, pin, nil
		}
		errs = append(errs, err)
	}
	return TPMEnrolment{}, pin, fmt.Errorf("the TPM's EK %s is not enrolled and its certificate is not from an enrolled EK CA: %w", pin, errors.Join(errs...))
}

func (s *Fleet) ekCAs() ([]TPMEnrolment, error) {
	b, err := s.store.Meta(metaEKCAs)
	if err != nil || len(b) == 0 {
		return nil, err
	}
	var cas []TPMEnrolment
	if err := json.Unmarshal(b, &cas); err != nil {
		return nil, fmt.Errorf("EK CAs: %w", err)
	}
	return cas, nil
}

func mustParseCerts(p string) []*x509.Certificate {
	cs, _ := pki.ParseCertPEM([]byte(p))
	return cs
}

// parseEKPublic reads an EK public key in any of the forms enrolment takes.
func parseEKPublic(b []byte) (crypto.PublicKey, error) {
	if blk, _ := pem.Decode(b); blk != nil {
		if blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("EK public key: PEM block %q, want PUBLIC KEY", blk.Type)
		}
		b = blk.Bytes
	}
	if k, err := x509.ParsePKIXPublicKey(b); err == nil {
		return k, nil
	}
	k, err := ek.PublicKey(b)
	if err != nil {
		return nil, fmt.Errorf("EK public key is neither a SubjectPublicKeyInfo nor an EK TPMT_PUBLIC: %w", err)
	}
	return k, nil
}

// EnrollTPM records an EK or an EK CA; tpm joins it admits join as site
// and role.
func (s *Fleet) EnrollTPM(r adminapi.TPMEnrollRequest) (adminapi.TPMEnrollResponse, error) {
	if r.Role == "" {
		r.Role = tpmRoleDefault
	}
	if r.Role != "node" && r.Role != "site" {
		return adminapi.TPMEnrollResponse{}, errors.New("role must be node or site")
	}
	if r.Site == "" {
		r.Site = "lab"
	}
	given := 0
	for _, ok := range []bool{len(r.EKPublic) > 0, r.EKPin != "", len(r.EKCA) > 0} {
		if ok {
			given++
		}
	}
	if given != 1 {
		return adminapi.TPMEnrollResponse{}, errors.New("give one of an EK public key, an EK pin or an EK CA")
	}
	e := TPMEnrolment{Site: r.Site, Role: r.Role, EnrolledAt: s.now().UTC()}
	out := adminapi.TPMEnrollResponse{Site: r.Site, Role: r.Role}
	if len(r.EKPublic) > 0 || r.EKPin != "" {
		pin := r.EKPin
		if pin != "" {
			if _, err := pki.ParsePin(pin); err != nil {
				return out, fmt.Errorf("EK pin: %w", err)
			}
		} else {
			k, err := parseEKPublic(r.EKPublic)
			if err != nil {
				return out, err
			}
			if pin, err = pki.Pin(k); err != nil {
				return out, err
			}
		}
		b, _ := json.Marshal(e)
		if err := s.store.SetMeta(metaEKPrefix+pin, b); err != nil {
			return out, err
		}
		out.EK = pin
		s.log.Info("TPM EK enrolled", "ek", pin, "site", r.Site, "role", r.Role)
		return out, nil
	}
	certs, err := pki.ParseCertPEM(r.EKCA)
	if err != nil || len(certs) == 0 {
		c, derr := x509.ParseCertificate(r.EKCA)
		if derr != nil {
			return out, fmt.Errorf("EK CA: neither PEM certificates nor one DER certificate: %w", derr)
		}
		certs = []*x509.Certificate{c}
	}
	var p bytes.Buffer
	for _, c := range certs {
		if !c.IsCA {
			return out, fmt.Errorf("EK CA %q is not a CA certificate", c.Subject.String())
		}
		p.Write(pki.CertPEM(c))
	}
	cas, err := s.ekCAs()
	if err != nil {
		return out, err
	}
	e.CAPEM = p.String()
	cas = append(cas, e)
	b, _ := json.Marshal(cas)
	if err := s.store.SetMeta(metaEKCAs, b); err != nil {
		return out, err
	}
	out.EKCA = certs[0].Subject.String()
	s.log.Info("TPM EK CA enrolled", "ca", out.EKCA, "site", r.Site, "role", r.Role)
	return out, nil
}
