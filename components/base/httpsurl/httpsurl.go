// Package httpsurl checks and redacts the https source URLs images are
// pulled from (the site's image cache, a node's base images): only an
// absolute https URL with a host is a source, and what reaches a log or an
// error never carries its query (a presigned URL's signature) or user
// information.
package httpsurl

import (
	"errors"
	"net/url"
)

// Check accepts an absolute https URL with a host.
func Check(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("source is not a URL")
	}
	if u.Scheme != "https" {
		return errors.New("source must be an https:// URL")
	}
	if u.Host == "" {
		return errors.New("source URL has no host")
	}
	return nil
}

// Redact drops the query, fragment and any user information from a URL
// for logs and errors.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User = nil
	u.RawQuery = ""
	u.ForceQuery = false
	u.Fragment = ""
	return u.String()
}

// RedactErr keeps net/http's errors, which quote the whole URL, from
// carrying a presigned query into logs.
func RedactErr(err error, sourceURL string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return &url.Error{Op: ue.Op, URL: Redact(sourceURL), Err: ue.Err}
	}
	return err
}
