// Package cloudiid is the cloud-iid attestor (docs/protocol.md#cloud-iid):
// an EC2 instance joins by proving it is that instance, with the identity
// document AWS signs for it, instead of with a token someone copied. The
// agent side tells an EC2 instance by its DMI and reads the document and
// its signature from IMDSv2 once; the gateway side verifies the signature
// against the certificates it pins (AWS's published ones, or a test's).
package cloudiid

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Attestor is the attestor's name in JoinRequest.attestor.
const Attestor = "cloud-iid"

// IMDS is the instance metadata service's address.
const IMDS = "http://169.254.169.254"

// Bounds of what IMDS answers and the gateway reads.
const (
	MaxDocument  = 16 << 10
	MaxSignature = 4 << 10
)

// HopLimitHint is what a read that IMDSv2 does not answer says: IMDSv2
// answers a token request only within the instance's hop limit, and a
// container without host networking is one hop further away.
const HopLimitHint = "IMDSv2 did not answer: on EC2 this usually means the instance's metadata hop limit " +
	"(HttpPutResponseHopLimit) is 1 while bcd runs in a container without host networking; set it to 2 " +
	"(aws ec2 modify-instance-metadata-options --http-put-response-hop-limit 2), or run bcd on the host's network"

// OnEC2 tells from the DMI under sysfs (normally /sys) whether this machine
// is an EC2 instance: sys_vendor "Amazon EC2" (Nitro), or "Xen" with EC2's
// BIOS version or a UUID starting ec2 (previous-generation types such as t2
// and m4). Off EC2 it says why.
func OnEC2(sysfs string) error {
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(sysfs, p))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	vendor := read("class/dmi/id/sys_vendor")
	switch {
	case vendor == "Amazon EC2":
		return nil
	case vendor == "Xen":
		if strings.Contains(strings.ToLower(read("class/dmi/id/bios_version")), "amazon") {
			return nil
		}
		for _, p := range []string{"hypervisor/uuid", "class/dmi/id/product_uuid"} {
			if strings.HasPrefix(strings.ToLower(read(p)), "ec2") {
				return nil
			}
		}
		return errors.New("this machine is not an EC2 instance: DMI sys_vendor is Xen, but neither its BIOS version nor its UUID is EC2's")
	case vendor == "":
		return errors.New("this machine is not an EC2 instance: it has no DMI sys_vendor")
	}
	return fmt.Errorf("this machine is not an EC2 instance: DMI sys_vendor is %q, not \"Amazon EC2\"", vendor)
}

// Evidence is what the agent sends: the document as IMDS served it and
// the base64 signature.
type Evidence struct {
	Document  []byte
	Signature []byte
}

// Fetch reads the identity document and its signature from IMDSv2 at base
// (IMDS): a session token (PUT /latest/api/token), then both with it.
func Fetch(ctx context.Context, base string) (Evidence, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/latest/api/token", nil)
	if err != nil {
		return Evidence{}, err
	}
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
	tok, err := get(hc, req, 256)
	if err != nil {
		return Evidence{}, fmt.Errorf("%s (%w)", HopLimitHint, err)
	}
	read := func(path string, max int64) ([]byte, error) {
		r, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return nil, err
		}
		r.Header.Set("X-aws-ec2-metadata-token", string(tok))
		b, err := get(hc, r, max)
		if err != nil {
			return nil, fmt.Errorf("IMDSv2 %s: %w", path, err)
		}
		return b, nil
	}
	var ev Evidence
	if ev.Document, err = read("/latest/dynamic/instance-identity/document", MaxDocument); err != nil {
		return Evidence{}, err
	}
	if ev.Signature, err = read("/latest/dynamic/instance-identity/signature", MaxSignature); err != nil {
		return Evidence{}, err
	}
	return ev, nil
}

func get(hc *http.Client, req *http.Request, max int64) ([]byte, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("answer larger than %d bytes", max)
	}
	return b, nil
}

// Document is what the gateway reads of a verified identity document.
type Document struct {
	AccountID        string    `json:"accountId"`
	InstanceID       string    `json:"instanceId"`
	Region           string    `json:"region"`
	AvailabilityZone string    `json:"availabilityZone"`
	InstanceType     string    `json:"instanceType"`
	ImageID          string    `json:"imageId"`
	PendingTime      time.Time `json:"pendingTime"`
}

// ParseCerts reads the PEM certificates a gateway pins for documents.
func ParseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		if _, ok := c.PublicKey.(*rsa.PublicKey); !ok {
			return nil, fmt.Errorf("certificate %q: not an RSA key (the base64 signature is RSA)", c.Subject.CommonName)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

// Verify checks ev's signature (RSA PKCS #1 v1.5 over the SHA-256 of the
// document's bytes) under one of certs and returns the document, which
// must name an account, an instance and a region. Certificate dates are
// not checked: AWS's published certificates outlive their stated expiry.
func Verify(ev Evidence, certs []*x509.Certificate) (Document, error) {
	var d Document
	if len(ev.Document) == 0 || len(ev.Document) > MaxDocument || len(ev.Signature) > MaxSignature {
		return d, errors.New("the identity document or its signature is empty or too large")
	}
	sig, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(ev.Signature)), ""))
	if err != nil {
		return d, fmt.Errorf("the signature is not base64: %w", err)
	}
	sum := sha256.Sum256(ev.Document)
	ok := false
	for _, c := range certs {
		if k, isRSA := c.PublicKey.(*rsa.PublicKey); isRSA && rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], sig) == nil {
			ok = true
			break
		}
	}
	if !ok {
		return d, errors.New("the identity document's signature does not verify under the pinned certificates")
	}
	dec := json.NewDecoder(bytes.NewReader(ev.Document))
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("the identity document: %w", err)
	}
	if d.AccountID == "" || d.InstanceID == "" || d.Region == "" {
		return d, errors.New("the identity document names no account, instance or region")
	}
	return d, nil
}
