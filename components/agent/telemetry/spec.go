package telemetry

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
)

// The bounds of a telemetry section.
const (
	DefaultInterval = 60 * time.Second
	MinInterval     = time.Second
	MaxInterval     = time.Hour
	MaxAttributes   = 32
	MaxHeaders      = 8
	maxAttrLen      = 256
	maxCAPEM        = 64 << 10
)

// SecretPrefix names a header's secret: the agent asks the gateway for
// "telemetry-header/<Canonical-Name>" with a SecretRequest, never reads
// it from the spec.
const SecretPrefix = "telemetry-header/"

// Spec is the telemetry section's body:
//
//	{"endpoint": "https://otel.example.internal:4318", "interval_s": 30,
//	 "ca_pem": "-----BEGIN CERTIFICATE-----...", "resource": {"deployment.environment": "lab"},
//	 "headers": ["Authorization"]}
//
// Metrics are posted to <endpoint>/v1/metrics (OTLP/HTTP, protobuf).
// ca_pem, when set, is the only CA the collector's certificate may chain
// to; without it the system roots are used. headers are names only: each
// value comes from the gateway through a sealed SecretRequest.
type Spec struct {
	Endpoint  string            `json:"endpoint"`
	IntervalS int               `json:"interval_s,omitempty"`
	CAPEM     string            `json:"ca_pem,omitempty"`
	Resource  map[string]string `json:"resource,omitempty"`
	Headers   []string          `json:"headers,omitempty"`
}

// reserved are the resource attributes bcd sets itself; a spec may not
// set them (a node cannot be made to report as another).
var reserved = []string{"service.name", "service.version", "service.instance.id", "bcd.node.id", "bcd.site", "bcd.role", "host.id"}

// Parse decodes a telemetry body strictly and checks its values. A nil
// body is no section: nil, nil.
func Parse(body json.RawMessage) (*Spec, error) {
	if body == nil || string(body) == "null" {
		return nil, nil
	}
	var s Spec
	if err := converge.DecodeSection(body, &s); err != nil {
		return nil, err
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	return &s, nil
}

func (s *Spec) check() error {
	u, err := url.Parse(s.Endpoint)
	switch {
	case s.Endpoint == "":
		return errors.New("telemetry: endpoint is required")
	case err != nil:
		return fmt.Errorf("telemetry: endpoint: %w", err)
	case u.Scheme != "https":
		return fmt.Errorf("telemetry: endpoint must be https://, not %q", u.Scheme)
	case u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return errors.New("telemetry: endpoint must be https://host[:port][/path] without user, query or fragment")
	}
	if s.IntervalS != 0 {
		if d := time.Duration(s.IntervalS) * time.Second; d < MinInterval || d > MaxInterval {
			return fmt.Errorf("telemetry: interval_s %d is outside %d to %d", s.IntervalS, int(MinInterval/time.Second), int(MaxInterval/time.Second))
		}
	}
	if s.CAPEM != "" {
		if _, err := caPool(s.CAPEM); err != nil {
			return err
		}
	}
	if len(s.Resource) > MaxAttributes {
		return fmt.Errorf("telemetry: %d resource attributes, at most %d", len(s.Resource), MaxAttributes)
	}
	for k, v := range s.Resource {
		switch {
		case k == "" || len(k) > maxAttrLen || len(v) > maxAttrLen || !printable(k) || !printable(v):
			return fmt.Errorf("telemetry: resource attribute %q: keys of 1 to %d and values of up to %d printable characters", trim(k), maxAttrLen, maxAttrLen)
		case slices.Contains(reserved, k):
			return fmt.Errorf("telemetry: resource attribute %q is bcd's own", k)
		}
	}
	if len(s.Headers) > MaxHeaders {
		return fmt.Errorf("telemetry: %d headers, at most %d", len(s.Headers), MaxHeaders)
	}
	seen := map[string]bool{}
	for _, h := range s.Headers {
		c := textproto.CanonicalMIMEHeaderKey(h)
		switch {
		case !token(h) || len(h) > 64:
			return fmt.Errorf("telemetry: header %q is not a header name", trim(h))
		case seen[c]:
			return fmt.Errorf("telemetry: header %s named twice", c)
		case c == "Content-Type" || c == "Content-Length" || c == "Host" || c == "Content-Encoding":
			return fmt.Errorf("telemetry: header %s is the exporter's own", c)
		}
		seen[c] = true
	}
	return nil
}

// Interval is how often metrics are collected and exported.
func (s *Spec) Interval() time.Duration {
	if s.IntervalS == 0 {
		return DefaultInterval
	}
	return time.Duration(s.IntervalS) * time.Second
}

// URL is where metrics are posted.
func (s *Spec) URL() string { return strings.TrimSuffix(s.Endpoint, "/") + "/v1/metrics" }

func caPool(p string) (*x509.CertPool, error) {
	if len(p) > maxCAPEM {
		return nil, fmt.Errorf("telemetry: ca_pem is over %d bytes", maxCAPEM)
	}
	pool := x509.NewCertPool()
	rest := []byte(p)
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("telemetry: ca_pem holds a %q block, want CERTIFICATE", trim(b.Type))
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("telemetry: ca_pem: %w", err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 || strings.TrimSpace(string(rest)) != "" {
		return nil, errors.New("telemetry: ca_pem must be PEM CERTIFICATE blocks only")
	}
	return pool, nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// token reports whether s is an HTTP header name (RFC 9110 token).
func token(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r > 0x7e || r <= 0x20 || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

// trim shortens what a refusal quotes.
func trim(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
