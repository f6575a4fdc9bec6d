package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// JoinTokenView is a join token as listed: never its secret.
type JoinTokenView struct {
	ID        string    `json:"id"`
	Role      string    `json:"role"`
	Site      string    `json:"site"`
	Uses      int       `json:"uses"`
	Used      int       `json:"used"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// NodeID, MAC and Command: a provisioned or discovery token's binding.
	NodeID  string `json:"node_id,omitempty"`
	MAC     string `json:"mac,omitempty"`
	Command string `json:"command,omitempty"`
	// CloudAccount and CloudRegion: a cloud-iid rule's (no one holds it).
	CloudAccount string `json:"cloud_iid_account,omitempty"`
	CloudRegion  string `json:"cloud_iid_region,omitempty"`
	Spent        bool   `json:"spent,omitempty"`
	Expired      bool   `json:"expired,omitempty"`
}

// JoinTokens lists the join tokens.
func (c *Client) JoinTokens(ctx context.Context) ([]JoinTokenView, error) {
	var out []JoinTokenView
	return out, c.do(ctx, http.MethodGet, "/v1/tokens", nil, &out)
}

// RemoveJoinToken deletes a join token.
func (c *Client) RemoveJoinToken(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(id), nil, nil)
}

// RemoveNode revokes a node and forgets it.
func (c *Client) RemoveNode(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/nodes/"+url.PathEscape(id), nil, nil)
}

// KeyRotation is what a rotation of bcgw's command-signing key did.
type KeyRotation struct {
	OldPin string `json:"old_pin"`
	NewPin string `json:"new_pin"`
	// Version is the trust bundle version that names the new key a root
	// (next to the old one).
	Version uint64 `json:"version"`
	// OldPublicKey is the file holding the old key's public half, for
	// bcgw trust remove-root --key once its commands are done.
	OldPublicKey string `json:"old_public_key"`
}

// RotateCommandKey rotates bcgw's own command-signing key.
func (c *Client) RotateCommandKey(ctx context.Context) (KeyRotation, error) {
	var out KeyRotation
	return out, c.do(ctx, http.MethodPost, "/v1/trust/rotate-key", nil, &out)
}

// Backup copies the gateway's bbolt store to w and returns its size.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/backup", nil)
	if err != nil {
		return 0, err
	}
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("admin API: %w (is bcgw serve running on this data directory?)", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e) == nil && e.Error != "" {
			return 0, errors.New(e.Error)
		}
		return 0, fmt.Errorf("admin API: %s", resp.Status)
	}
	return io.Copy(w, resp.Body)
}

// ServingView is the serving certificate a gateway presents.
type ServingView struct {
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
}

// RenewServing has the gateway issue itself a new serving leaf now.
func (c *Client) RenewServing(ctx context.Context) (ServingView, error) {
	var out ServingView
	return out, c.do(ctx, http.MethodPost, "/v1/serving/renew", nil, &out)
}
