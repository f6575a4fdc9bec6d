package httpproxy

import "crypto/tls"

// insecureTLS is for BMCs with self-signed certificates, asked for per
// request (insecure_tls).
func insecureTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // asked for per request
}
