package logbundle

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
)

// presignedQuery stands in for the credentials of a presigned URL.
const presignedQuery = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAFAKE%2F20240101&X-Amz-Signature=deadbeefcafe"

// bucket is a fake object store that records what it was sent.
type bucket struct {
	mu      sync.Mutex
	method  string
	ctype   string
	length  int64
	body    []byte
	status  int
	errBody string
}

func (b *bucket) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.method, b.ctype, b.length, b.body = r.Method, r.Header.Get("Content-Type"), r.ContentLength, body
	status, errBody := b.status, b.errBody
	b.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
		io.WriteString(w, errBody)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestUpload(t *testing.T) {
	payload := []byte("a gzip stream, as far as the server can tell")
	tests := []struct {
		name   string
		status int
		body   string
		url    func(srv string) string
		sha    string
		client func(srv *httptest.Server) *http.Client
		err    string // a part of the error; "" for success
	}{
		{name: "ok", sha: sha(payload)},
		{name: "ok without a checksum"},
		{name: "created", status: http.StatusCreated},
		{
			name: "forbidden", status: http.StatusForbidden,
			body: "<Error><Code>SignatureDoesNotMatch</Code><CanonicalRequest>PUT /key " + presignedQuery + "</CanonicalRequest></Error>",
			err:  "403 Forbidden (SignatureDoesNotMatch)",
		},
		{name: "server error", status: http.StatusInternalServerError, err: "500 Internal Server Error"},
		{name: "http refused", url: func(srv string) string { return "http" + strings.TrimPrefix(srv, "https") + "/key?" + presignedQuery }, err: "refusing http"},
		{name: "no scheme", url: func(string) string { return "bucket/key?" + presignedQuery }, err: "must be https"},
		{name: "bad url", url: func(string) string { return "https://bad host/key?" + presignedQuery }, err: "not a valid URL"},
		{name: "checksum mismatch", sha: sha([]byte("other")), err: "hash to " + sha(payload)},
		{name: "bad checksum", sha: "xyz", err: "not a SHA-256"},
		{
			name:   "untrusted certificate",
			client: func(*httptest.Server) *http.Client { return &http.Client{} },
			err:    "certificate",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &bucket{status: tt.status, errBody: tt.body}
			srv := httptest.NewTLSServer(b)
			defer srv.Close()
			url := srv.URL + "/bundles/n1.tar.gz?" + presignedQuery
			if tt.url != nil {
				url = tt.url(srv.URL)
			}
			client := srv.Client()
			if tt.client != nil {
				client = tt.client(srv)
			}
			err := Upload(context.Background(), client, url, bytes.NewReader(payload), int64(len(payload)), tt.sha)
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if b.method != http.MethodPut || b.ctype != "application/gzip" || b.length != int64(len(payload)) || !bytes.Equal(b.body, payload) {
					t.Errorf("server got %s %q length %d body %q", b.method, b.ctype, b.length, b.body)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("err = %v, want %q", err, tt.err)
			}
			t.Logf("error: %v", err)
			for _, leak := range []string{presignedQuery, "X-Amz-Signature", "deadbeefcafe", "AKIAFAKE"} {
				if strings.Contains(err.Error(), leak) {
					t.Errorf("error %q holds %q", err, leak)
				}
			}
			var se *StatusError
			if tt.status >= 300 && (!errors.As(err, &se) || se.StatusCode != tt.status) {
				t.Errorf("err = %#v, want a *StatusError %d", err, tt.status)
			}
		})
	}
}

func TestUploadConnectionErrorHidesQuery(t *testing.T) {
	srv := httptest.NewTLSServer(&bucket{})
	client := srv.Client()
	url := srv.URL + "/key?" + presignedQuery
	srv.Close()
	err := Upload(context.Background(), client, url, strings.NewReader("x"), 1, "")
	if err == nil {
		t.Fatal("upload to a closed server succeeded")
	}
	if strings.Contains(err.Error(), "X-Amz") || !strings.Contains(err.Error(), "?[REDACTED]") {
		t.Errorf("error %q", err)
	}
	// Unwrapping must not find the query either.
	for e := err; e != nil; e = errors.Unwrap(e) {
		if strings.Contains(e.Error(), "X-Amz") {
			t.Errorf("wrapped error %q holds the query", e)
		}
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://b.s3.amazonaws.com/k/n1.tar.gz?X-Amz-Signature=abc": "https://b.s3.amazonaws.com/k/n1.tar.gz?[REDACTED]",
		"https://u:pw@host:8443/p?q#frag":                            "https://u:REDACTED@host:8443/p?[REDACTED]",
		"https://host/p#frag":                                        "https://host/p",
		"https://host/p?":                                            "https://host/p",
		"https://user@host/p":                                        "https://user@host/p",
		"not a url?secret":                                           "not a url?[REDACTED]",
		"":                                                           "",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCollect(t *testing.T) {
	b := &bucket{}
	srv := httptest.NewTLSServer(b)
	defer srv.Close()
	dir := t.TempDir()
	res, err := Collect(context.Background(), Options{
		URL:     srv.URL + "/bundles/n1.tar.gz?" + presignedQuery,
		Client:  srv.Client(),
		Sources: []Source{static("config.toml", "join_token = \"bcjt_x_y\"\n"), failing("dmesg.txt", "", errors.New("operation not permitted"))},
		Dir:     dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes != int64(len(b.body)) || res.SHA256 != sha(b.body) {
		t.Errorf("result %d bytes sha %s; server got %d bytes sha %s", res.Bytes, res.SHA256, len(b.body), sha(b.body))
	}
	if len(res.Files) != 2 || res.Files[1].Error != "operation not permitted" {
		t.Errorf("files %+v", res.Files)
	}
	files, _ := untar(t, b.body)
	if files["config.toml"] != "join_token = \"[REDACTED]\"\n" {
		t.Errorf("uploaded config.toml = %q", files["config.toml"])
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// A refused upload removes the file too, and an http URL reads nothing.
	b.status = http.StatusForbidden
	if _, err := Collect(context.Background(), Options{URL: srv.URL + "/k?" + presignedQuery, Client: srv.Client(), Dir: dir}); err == nil || strings.Contains(err.Error(), "X-Amz") {
		t.Errorf("refused upload: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("temporary files left after a refused upload: %v", left)
	}
	read := false
	src := Source{Name: "x", Read: func(context.Context) ([]byte, error) { read = true; return nil, nil }}
	if _, err := Collect(context.Background(), Options{URL: "http://bucket/k?" + presignedQuery, Sources: []Source{src}, Dir: dir}); err == nil || read {
		t.Errorf("http URL: err %v, source read %v", err, read)
	}
}
