package pki

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

const (
	spiffeScheme        = "spiffe"
	maxTrustDomainLen   = 255
	maxSPIFFEIDLen      = 2048
	maxSPIFFESegmentLen = 255
)

// SPIFFEID returns spiffe://<trustDomain>/<role>/<nodeID>. It does not
// validate its inputs; ParseSPIFFEID (which IssueClient calls) does.
func SPIFFEID(trustDomain, role, nodeID string) *url.URL {
	return &url.URL{Scheme: spiffeScheme, Host: trustDomain, Path: "/" + role + "/" + nodeID}
}

// ParseSPIFFEID splits a bcd SPIFFE ID of the form
// spiffe://<trustDomain>/<role>/<nodeID>. The trust domain may hold lowercase
// letters, digits, '.', '-' and '_'; role and nodeID may hold letters, digits,
// '.', '-' and '_' and may not be "." or "..". No port, user info, query,
// fragment or percent-encoding is allowed.
func ParseSPIFFEID(u *url.URL) (trustDomain, role, nodeID string, err error) {
	if u == nil {
		return "", "", "", errors.New("parse SPIFFE ID: nil URL")
	}
	if u.Scheme != spiffeScheme {
		return "", "", "", errors.New("parse SPIFFE ID: scheme is not spiffe")
	}
	if u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.ForceQuery ||
		u.Fragment != "" || u.RawFragment != "" || u.RawPath != "" || u.OmitHost {
		return "", "", "", errors.New("parse SPIFFE ID: must be spiffe://<trust-domain>/<role>/<node-id> without user info, query, fragment or percent-encoding")
	}
	if len(u.String()) > maxSPIFFEIDLen {
		return "", "", "", fmt.Errorf("parse SPIFFE ID: longer than %d characters", maxSPIFFEIDLen)
	}
	td := u.Host
	if td == "" || len(td) > maxTrustDomainLen || !validChars(td, true) {
		return "", "", "", errors.New("parse SPIFFE ID: invalid trust domain")
	}
	rest, ok := strings.CutPrefix(u.Path, "/")
	if !ok {
		return "", "", "", errors.New("parse SPIFFE ID: missing path")
	}
	role, nodeID, ok = strings.Cut(rest, "/")
	if !ok || strings.Contains(nodeID, "/") {
		return "", "", "", errors.New("parse SPIFFE ID: path must be /<role>/<node-id>")
	}
	if !validSegment(role) {
		return "", "", "", errors.New("parse SPIFFE ID: invalid role segment")
	}
	if !validSegment(nodeID) {
		return "", "", "", errors.New("parse SPIFFE ID: invalid node ID segment")
	}
	return td, role, nodeID, nil
}

func validSegment(s string) bool {
	return s != "" && s != "." && s != ".." && len(s) <= maxSPIFFESegmentLen && validChars(s, false)
}

func validChars(s string, lowerOnly bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '-', c == '_':
		case c >= 'A' && c <= 'Z' && !lowerOnly:
		default:
			return false
		}
	}
	return true
}
