package adminapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/filehash"
)

// Client talks to a running bcgw's admin API, over the data
// directory's unix socket or a loopback URL with a bearer token.
type Client struct {
	base   string
	bearer string
	hc     *http.Client
}

// NewClient returns a client for the server whose data directory is
// dataDir, or, when url is set, for that loopback admin URL with bearer.
func NewClient(dataDir, url, bearer string) *Client {
	if url != "" {
		return &Client{base: strings.TrimRight(url, "/"), bearer: bearer, hc: &http.Client{Timeout: 11 * time.Minute}}
	}
	sock := filepath.Join(dataDir, AdminSocket)
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	return &Client{base: "http://bcgw", hc: &http.Client{Transport: tr, Timeout: 11 * time.Minute}}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		// Not json.Marshal: it would rewrite <, > and & inside a raw JSON
		// body or spec, whose exact bytes a signature may cover.
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(in); err != nil {
			return err
		}
		body = buf.Bytes()
	}
	return c.doRaw(ctx, method, path, body, out)
}

// doRaw sends body as it is (nil: no body) and decodes the answer into out.
func (c *Client) doRaw(ctx context.Context, method, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.send(req, out)
}

// send sends req with the admin bearer and decodes the answer into out.
func (c *Client) send(req *http.Request, out any) error {
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API: %w (is bcgw serve running on this data directory?)", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return errors.New(e.Error)
		}
		return fmt.Errorf("admin API: %s", resp.Status)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// CreateToken asks for a join token.
func (c *Client) CreateToken(ctx context.Context, r TokenRequest) (TokenResponse, error) {
	var out TokenResponse
	return out, c.do(ctx, http.MethodPost, "/v1/tokens", r, &out)
}

// Nodes lists nodes.
func (c *Client) Nodes(ctx context.Context) ([]NodeView, error) {
	var out []NodeView
	return out, c.do(ctx, http.MethodGet, "/v1/nodes", nil, &out)
}

// Revoke revokes a node.
func (c *Client) Revoke(ctx context.Context, node string) error {
	return c.do(ctx, http.MethodPost, "/v1/nodes/"+node+"/revoke", nil, nil)
}

// Send sends a command.
func (c *Client) Send(ctx context.Context, r CommandRequest) (CommandView, error) {
	var out CommandView
	return out, c.do(ctx, http.MethodPost, "/v1/commands", r, &out)
}

// Command reads a command, waiting up to wait for its result.
func (c *Client) Command(ctx context.Context, id string, wait time.Duration) (CommandView, error) {
	var out CommandView
	return out, c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/commands/%s?wait=%d", id, int(wait/time.Second)), nil, &out)
}

// Cancel cancels a command.
func (c *Client) Cancel(ctx context.Context, id, reason string) (CommandView, error) {
	var out CommandView
	return out, c.do(ctx, http.MethodPost, "/v1/commands/"+id+"/cancel", map[string]string{"reason": reason}, &out)
}

// SetBMCCredentials stores a BMC's credentials in bcgw.
func (c *Client) SetBMCCredentials(ctx context.Context, address, username, password string) error {
	return c.EnrollBMC(ctx, address, username, password, false)
}

// EnrollBMC stores a BMC's credentials and whether commands may reach it
// with legacy TLS.
func (c *Client) EnrollBMC(ctx context.Context, address, username, password string, legacyTLS bool) error {
	return c.do(ctx, http.MethodPost, "/v1/bmc", map[string]any{"address": address, "username": username, "password": password, "legacy_tls": legacyTLS}, nil)
}

// Status reads a node's status: the gateway's view of it and its latest
// StatusReport.
func (c *Client) Status(ctx context.Context, node string) (StatusView, error) {
	var out StatusView
	return out, c.do(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(node)+"/status", nil, &out)
}

// Events reads a node's stored events with a seq above after, oldest
// first.
func (c *Client) Events(ctx context.Context, node string, after uint64) ([]EventView, error) {
	var out []EventView
	return out, c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/nodes/%s/events?after=%d", url.PathEscape(node), after), nil, &out)
}

// Spec reads a node's desired spec.
func (c *Client) Spec(ctx context.Context, node string) (SpecView, error) {
	var out SpecView
	return out, c.do(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(node)+"/spec", nil, &out)
}

// SetSpec replaces a node's desired spec with spec (JSON, sent as it is)
// and returns its generation.
func (c *Client) SetSpec(ctx context.Context, node string, spec []byte) (uint64, error) {
	var out GenerationView
	err := c.doRaw(ctx, http.MethodPut, "/v1/nodes/"+url.PathEscape(node)+"/spec", nonNil(spec), &out)
	return out.Generation, err
}

// PatchSpec applies an RFC 7396 merge patch to a node's desired spec and
// returns its generation.
func (c *Client) PatchSpec(ctx context.Context, node string, patch []byte) (uint64, error) {
	var out GenerationView
	err := c.doRaw(ctx, http.MethodPatch, "/v1/nodes/"+url.PathEscape(node)+"/spec", nonNil(patch), &out)
	return out.Generation, err
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// SetCacheImages tells a site agent what to keep in its image cache.
func (c *Client) SetCacheImages(ctx context.Context, node string, images []CacheImage) error {
	return c.do(ctx, http.MethodPost, "/v1/nodes/"+node+"/cache-images", map[string]any{"images": images}, nil)
}

// WellKnown reads the well-known document.
func (c *Client) WellKnown(ctx context.Context, out any) error {
	return c.do(ctx, http.MethodGet, "/v1/well-known", nil, out)
}

// PrepareCommand asks for a command to sign elsewhere: nothing is stored
// or sent.
func (c *Client) PrepareCommand(ctx context.Context, r CommandRequest) (PreparedCommand, error) {
	var out PreparedCommand
	return out, c.do(ctx, http.MethodPost, "/v1/commands/prepare", r, &out)
}

// SubmitCommand sends a prepared command as it is (signed or not).
func (c *Client) SubmitCommand(ctx context.Context, r SubmitCommandRequest) (CommandView, error) {
	var out CommandView
	return out, c.do(ctx, http.MethodPost, "/v1/commands/submit", r, &out)
}

// PrepareSpec works out a node's next spec generation from spec (a full
// spec, or with patch a merge patch) without storing it.
func (c *Client) PrepareSpec(ctx context.Context, node string, spec []byte, patch bool) (PreparedSpec, error) {
	var out PreparedSpec
	return out, c.doRaw(ctx, http.MethodPost, fmt.Sprintf("/v1/nodes/%s/spec/prepare?patch=%t", url.PathEscape(node), patch), nonNil(spec), &out)
}

// SubmitSpec stores and sends a prepared spec as it is (signed or not).
func (c *Client) SubmitSpec(ctx context.Context, p PreparedSpec) (SubmitView, error) {
	var out SubmitView
	return out, c.do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(p.Node)+"/spec/submit", p, &out)
}

// UploadArtifact sends a release binary (the file at path) to the
// gateway, which keeps it for PublishRelease; it returns its SHA-256.
func (c *Client) UploadArtifact(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sum, err := filehash.Reader(f, path)
	if err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+"/v1/releases/uploads/"+sum, f)
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if err := c.send(req, nil); err != nil {
		return "", fmt.Errorf("upload %s: %w", path, err)
	}
	return sum, nil
}

// PublishRelease publishes a signed release document with the binaries
// uploaded for it.
func (c *Client) PublishRelease(ctx context.Context, r PublishRequest) (Published, error) {
	var out Published
	return out, c.do(ctx, http.MethodPost, "/v1/releases", r, &out)
}

// Releases lists the published releases.
func (c *Client) Releases(ctx context.Context) ([]ReleaseView, error) {
	var out []ReleaseView
	return out, c.do(ctx, http.MethodGet, "/v1/releases", nil, &out)
}

// ReleaseDoc returns a published release's document.
func (c *Client) ReleaseDoc(ctx context.Context, version string) ([]byte, error) {
	var out ReleaseDocView
	err := c.do(ctx, http.MethodGet, "/v1/releases/"+url.PathEscape(version), nil, &out)
	return out.Doc, err
}

// Health is the gateway's own health (its database, its sessions).
func (c *Client) Health(ctx context.Context) (HealthView, error) {
	var out HealthView
	return out, c.do(ctx, http.MethodGet, "/v1/health", nil, &out)
}

// Trust reads the trust bundle.
func (c *Client) Trust(ctx context.Context) (TrustView, error) {
	var out TrustView
	return out, c.do(ctx, http.MethodGet, "/v1/trust", nil, &out)
}

// AddTrustRoot adds a command-signing root (SPKI DER).
func (c *Client) AddTrustRoot(ctx context.Context, spki []byte) (TrustChange, error) {
	var out TrustChange
	return out, c.do(ctx, http.MethodPost, "/v1/trust/roots", TrustRootRequest{SPKI: spki}, &out)
}

// RemoveTrustRoot removes a command-signing root (SPKI DER).
func (c *Client) RemoveTrustRoot(ctx context.Context, spki []byte) (TrustChange, error) {
	var out TrustChange
	return out, c.do(ctx, http.MethodPost, "/v1/trust/roots/remove", TrustRootRequest{SPKI: spki}, &out)
}

// SetApprovers puts an approver set into the trust bundle.
func (c *Client) SetApprovers(ctx context.Context, a ApproverSet) (ApproversChange, error) {
	var out ApproversChange
	return out, c.do(ctx, http.MethodPost, "/v1/trust/approvers", a, &out)
}

// SubmitBatch sends every command of a batch with its batch leaf.
func (c *Client) SubmitBatch(ctx context.Context, bf BatchFile) (BatchSubmitView, error) {
	var out BatchSubmitView
	return out, c.do(ctx, http.MethodPost, "/v1/batches/submit", bf, &out)
}

// Hold adds or replaces a GPU hold in a node's spec (bcgw hold).
func (c *Client) Hold(ctx context.Context, node string, h HoldRequest) (uint64, error) {
	var v GenerationView
	err := c.do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(node)+"/holds", h, &v)
	return v.Generation, err
}

// SSHCA is bcgw ssh-ca.
func (c *Client) SSHCA(ctx context.Context, r SSHCARequest) (SSHCAView, error) {
	var v SSHCAView
	err := c.do(ctx, http.MethodPost, "/v1/ssh/ca", r, &v)
	return v, err
}

// SSHSign is bcgw ssh-sign.
func (c *Client) SSHSign(ctx context.Context, r SSHSignRequest) (SSHSignView, error) {
	var v SSHSignView
	err := c.do(ctx, http.MethodPost, "/v1/ssh/sign", r, &v)
	return v, err
}

// Release removes a node's hold (bcgw release).
func (c *Client) Release(ctx context.Context, node, alloc string) (uint64, error) {
	var v GenerationView
	err := c.do(ctx, http.MethodDelete, "/v1/nodes/"+url.PathEscape(node)+"/holds/"+url.PathEscape(alloc), nil, &v)
	return v.Generation, err
}

// Tunnel asks bcgw for a tunnel to node and returns the upgraded
// connection (write frames with WriteTunnelFrame, read the node's bytes)
// and the ticket id. A refusal (the node's included) is an error.
func (c *Client) Tunnel(ctx context.Context, node string, r TunnelRequest) (io.ReadWriteCloser, string, error) {
	q := url.Values{"kind": {r.Kind}}
	if r.Account != "" {
		q.Set("account", r.Account)
	}
	if r.TTL != 0 {
		q.Set("ttl", r.TTL.String())
	}
	if r.Instance != "" {
		q.Set("instance", r.Instance)
	}
	path := "/v1/nodes/" + url.PathEscape(node) + "/tunnel?"
	if node == "" {
		// The gateway finds the node that runs the instance.
		path = "/v1/instances/" + url.PathEscape(r.Instance) + "/tunnel?"
		q.Del("instance")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path+q.Encode(), nil)
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", TunnelUpgrade)
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	// No client timeout: the tunnel lives as long as its ticket.
	hc := &http.Client{Transport: c.hc.Transport}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("admin API: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		var e struct {
			Error string `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return nil, "", errors.New(e.Error)
		}
		return nil, "", fmt.Errorf("admin API: %s", resp.Status)
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, "", errors.New("admin API: the upgraded connection is not writable")
	}
	return rw, resp.Header.Get("Bcd-Ticket-Id"), nil
}

// WriteTunnelFrame writes one client frame: typ with payload p.
func WriteTunnelFrame(w io.Writer, typ byte, p []byte) error {
	if len(p) > MaxTunnelFrame {
		return fmt.Errorf("tunnel frame of %d bytes; at most %d", len(p), MaxTunnelFrame)
	}
	hdr := [5]byte{typ}
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	_, err := w.Write(p)
	return err
}
