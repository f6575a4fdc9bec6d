// Package pki is the public-key infrastructure shared by bcd agents and the
// bcgw gateway: ECDSA P-256 keys, SPKI pins, purpose-framed signatures, CSRs,
// a small certificate authority, pinned TLS 1.3 configurations and JWE
// sealing of join tokens.
//
// Every key this package creates or accepts is ECDSA P-256 (ES256). Trust is
// always anchored in an explicit pin or CA certificate, never in system roots.
// Error messages never contain secrets (tokens, private keys).
package pki
