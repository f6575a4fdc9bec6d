// Package fakehttp is the HTTP client of fakehw builds: it trusts the
// system roots and test CAs from the environment. It is apart from
// components/machine/fakehw so that a fakehw build of a role without HTTP (the
// helper) links no net/http.
package fakehttp

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"time"
)

// ExtraCAEnv names a PEM file of CA certificates a fakehw build trusts for
// https downloads and uploads besides the system roots, so tests can serve
// image sources and presigned upload URLs from a local TLS server.
const ExtraCAEnv = "BCD_FAKEHW_EXTRA_CA"

// Roots returns the system roots and the CAs in $BCD_FAKEHW_EXTRA_CA, or
// nil (the system roots alone) when it is unset.
func Roots() *x509.CertPool {
	f := os.Getenv(ExtraCAEnv)
	if f == "" {
		return nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if b, err := os.ReadFile(f); err == nil {
		pool.AppendCertsFromPEM(b)
	}
	return pool
}

// Client returns an HTTP client trusting Roots, or nil (the default
// client) when $BCD_FAKEHW_EXTRA_CA is unset.
func Client() *http.Client {
	pool := Roots()
	if pool == nil {
		return nil
	}
	return &http.Client{Timeout: 30 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}
