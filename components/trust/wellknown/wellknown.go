// Package wellknown is the control plane's /.well-known/better-compute
// document: where the gateway is and which keys to pin. Agents fetch it
// over TLS pinned to the serving CA and check every pin before using it.
package wellknown

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/trust/pki"
)

// Path is where the document is served.
const Path = "/.well-known/better-compute"

// MaxSize bounds the document.
const MaxSize = 64 << 10

// Document is the JSON served at Path.
type Document struct {
	Gateway Gateway `json:"gateway"`
	Pins    Pins    `json:"pins"`
	Join    Join    `json:"join"`
}

// Gateway says where agents dial.
type Gateway struct {
	URL        string `json:"url"`
	ServerName string `json:"serverName"`
}

// Pins are the SPKI pins an install checks against its own.
type Pins struct {
	ServingCA      string `json:"servingCa"`
	JoinSigning    string `json:"joinSigning"`
	JoinEncryption string `json:"joinEncryption"`
}

// Join carries the JoinService's public encryption key.
type Join struct {
	EncryptionJWK json.RawMessage `json:"encryptionJwk"`
}

// Parse decodes a document and checks that its fields are usable and that
// the encryption key matches the document's own pin.
func Parse(b []byte) (*Document, *jose.JSONWebKey, error) {
	if len(b) > MaxSize {
		return nil, nil, fmt.Errorf("well-known document is larger than %d bytes", MaxSize)
	}
	var d Document
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, nil, fmt.Errorf("parse well-known document: %w", err)
	}
	u, err := url.Parse(d.Gateway.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, nil, fmt.Errorf("well-known document: gateway.url is not an https URL")
	}
	for name, p := range map[string]string{"pins.servingCa": d.Pins.ServingCA, "pins.joinSigning": d.Pins.JoinSigning, "pins.joinEncryption": d.Pins.JoinEncryption} {
		if _, err := pki.ParsePin(p); err != nil {
			return nil, nil, fmt.Errorf("well-known document: %s: %w", name, err)
		}
	}
	jwk, err := pki.ParsePublicJWK(d.Join.EncryptionJWK)
	if err != nil {
		return nil, nil, fmt.Errorf("well-known document: join.encryptionJwk: %w", err)
	}
	pin, err := pki.JWKPin(jwk)
	if err != nil {
		return nil, nil, err
	}
	if pin != d.Pins.JoinEncryption {
		return nil, nil, fmt.Errorf("well-known document: join.encryptionJwk does not match pins.joinEncryption")
	}
	return &d, jwk, nil
}

// Fetch reads the document from server (an https URL) over TLS pinned to
// servingCAPin.
func Fetch(ctx context.Context, server, servingCAPin string) (*Document, *jose.JSONWebKey, error) {
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, nil, fmt.Errorf("--server must be an https URL")
	}
	tc, err := pki.ClientTLS(servingCAPin, u.Hostname(), nil)
	if err != nil {
		return nil, nil, err
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.JoinPath(Path).String(), nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", Path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET %s: %s", Path, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxSize+1))
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", Path, err)
	}
	return Parse(b)
}
