package logbundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// DefaultMaxBytes is Collect's cap on a bundle's content when
// Options.MaxBytes is 0.
const DefaultMaxBytes = 64 << 20

// StatusError is an upload the server answered with a status other than
// 2xx.
type StatusError struct {
	// URL is the upload URL without its query (RedactURL).
	URL        string
	StatusCode int
	Status     string
	// Code is the storage service's error code from the response body
	// (S3's <Code>AccessDenied</Code>), when it had one.
	Code string
}

func (e *StatusError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("PUT %s: %s (%s)", e.URL, e.Status, e.Code)
	}
	return fmt.Sprintf("PUT %s: %s", e.URL, e.Status)
}

// RedactURL returns raw without what a presigned URL's credentials live
// in: the query becomes "?[REDACTED]", a userinfo password REDACTED, and
// the fragment is dropped. It works on strings that do not parse, so an
// error about a malformed URL can name it too.
func RedactURL(raw string) string {
	s, _, _ := strings.Cut(raw, "#")
	s, query, hasQuery := strings.Cut(s, "?")
	if scheme, rest, ok := strings.Cut(s, "://"); ok {
		authority, pth, hasPath := strings.Cut(rest, "/")
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			user, _, hasPass := strings.Cut(authority[:at], ":")
			if hasPass {
				authority = user + ":" + RedactedURLPassword + authority[at:]
			}
		}
		s = scheme + "://" + authority
		if hasPath {
			s += "/" + pth
		}
	}
	if hasQuery && query != "" {
		s += "?" + Redacted
	}
	return s
}

// checkURL parses an upload URL and refuses anything but https.
func checkURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error quotes the URL, query and all.
		return nil, fmt.Errorf("parsing the upload URL %s: not a valid URL", RedactURL(raw))
	}
	if u.Scheme != "https" {
		scheme := u.Scheme
		if scheme == "" {
			scheme = "a URL without a scheme"
		}
		return nil, fmt.Errorf("uploading to %s: refusing %s, the upload URL must be https", RedactURL(raw), scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("uploading to %s: the URL has no host", RedactURL(raw))
	}
	return u, nil
}

// Upload PUTs size bytes of body to rawURL, a presigned https URL, with
// Content-Type application/gzip. Any URL but https is refused. A 2xx
// answer is success; any other is a *StatusError. When sha256hex is set,
// the bytes sent must hash to it, or Upload fails after the PUT. No error
// holds the URL's query (it carries the presigned credentials). A nil
// client is a plain http.Client; ctx bounds the whole upload.
func Upload(ctx context.Context, client *http.Client, rawURL string, body io.Reader, size int64, sha256hex string) error {
	if _, err := checkURL(rawURL); err != nil {
		return err
	}
	safe := RedactURL(rawURL)
	if size < 0 {
		return fmt.Errorf("uploading to %s: negative size %d", safe, size)
	}
	want := strings.ToLower(sha256hex)
	if want != "" {
		if b, err := hex.DecodeString(want); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("uploading to %s: %q is not a SHA-256 in hex", safe, sha256hex)
		}
	}
	if client == nil {
		client = &http.Client{}
	}
	h := sha256.New()
	var reqBody io.Reader = http.NoBody
	if size > 0 {
		reqBody = &hashReader{r: io.LimitReader(body, size), h: h}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, rawURL, reqBody)
	if err != nil {
		return fmt.Errorf("uploading to %s: %w", safe, redactErr(err, rawURL))
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/gzip")
	resp, err := client.Do(req)
	if err != nil {
		// The *url.Error names the method and the (redacted) URL.
		return fmt.Errorf("uploading the log bundle: %w", redactErr(err, rawURL))
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		head, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return &StatusError{URL: safe, StatusCode: resp.StatusCode, Status: resp.Status, Code: errorCode(head)}
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if want != "" {
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			return fmt.Errorf("uploading to %s: the bytes sent hash to %s, not %s", safe, got, want)
		}
	}
	return nil
}

type hashReader struct {
	r io.Reader
	h hash.Hash
}

func (r *hashReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.h.Write(p[:n])
	return n, err
}

// errorCode finds S3's error code in an error answer; nothing else of it
// is kept, since a signature mismatch answer quotes the signed query.
func errorCode(body []byte) string {
	m := regexp.MustCompile(`<Code>([A-Za-z0-9.]{1,64})</Code>`).FindSubmatch(body)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// redactErr strips rawURL's query from an http.Client error: the
// *url.Error it returns quotes the URL.
func redactErr(err error, rawURL string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = RedactURL(ue.URL)
	}
	msg := err.Error()
	if _, q, ok := strings.Cut(rawURL, "?"); ok && q != "" && strings.Contains(msg, q) {
		return &scrubbed{msg: strings.ReplaceAll(msg, q, Redacted), err: err}
	}
	return err
}

// scrubbed is an error whose text had a URL query removed.
type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// Options is what Collect needs.
type Options struct {
	// URL is the presigned https URL the bundle is PUT to.
	URL string
	// Client makes the upload; nil is a plain http.Client.
	Client  *http.Client
	Sources []Source
	// MaxBytes caps the bundle's content; 0 is DefaultMaxBytes, below 0
	// no cap.
	MaxBytes int64
	// Dir is where the bundle is built before the upload; "" is
	// os.TempDir().
	Dir string
}

// Result is what logs.collect reports.
type Result struct {
	// Bytes and SHA256 are the uploaded tar.gz's.
	Bytes  int64           `json:"bytes"`
	SHA256 string          `json:"sha256"`
	Files  []ManifestEntry `json:"files"`
}

// Collect builds the bundle of opts.Sources into a temporary file (mode
// 0600) in opts.Dir, hashes it, uploads it to opts.URL and removes the
// file. The URL is checked before any source is read. When only the
// upload fails, the result still describes the bundle that was built.
func Collect(ctx context.Context, opts Options) (Result, error) {
	if _, err := checkURL(opts.URL); err != nil {
		return Result{}, err
	}
	maxBytes := opts.MaxBytes
	if maxBytes == 0 {
		maxBytes = DefaultMaxBytes
	}
	f, err := os.CreateTemp(opts.Dir, "bcd-logs-*.tar.gz")
	if err != nil {
		return Result{}, fmt.Errorf("creating the log bundle's temporary file: %w", err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	m, err := Build(ctx, opts.Sources, cw, maxBytes)
	if err != nil {
		return Result{}, err
	}
	res := Result{Bytes: cw.n, SHA256: hex.EncodeToString(h.Sum(nil)), Files: m.Files}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Result{}, fmt.Errorf("seek %s 0: %w", f.Name(), err)
	}
	if err := Upload(ctx, opts.Client, opts.URL, f, res.Bytes, res.SHA256); err != nil {
		return res, err
	}
	return res, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
