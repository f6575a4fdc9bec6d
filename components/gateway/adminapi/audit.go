package adminapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// AdminTokenRequest names a new admin token.
type AdminTokenRequest struct {
	Name string `json:"name"`
}

// AdminTokenResponse carries a new admin token, shown once.
type AdminTokenResponse struct {
	Name  string `json:"name"`
	Token string `json:"token"`
}

// AdminTokenView is an admin token as listed (never its secret).
type AdminTokenView struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	CreatedBy string    `json:"created_by,omitempty"`
	// Default: the token bcgw serve writes to DATA/admin.token at every
	// start, this gateway's own, which cannot be removed.
	Default bool `json:"default,omitempty"`
}

// AuditView is one entry of the audit trail: an admin API call that
// changed (or tried to change) state.
type AuditView struct {
	Seq     uint64    `json:"seq"`
	At      time.Time `json:"at"`
	Actor   string    `json:"actor"`
	Gateway string    `json:"gateway,omitempty"`
	Action  string    `json:"action"`
	Target  string    `json:"target,omitempty"`
	Status  int       `json:"status"`
	Error   string    `json:"error,omitempty"`
}

// CreateAdminToken makes a named admin token.
func (c *Client) CreateAdminToken(ctx context.Context, name string) (AdminTokenResponse, error) {
	var out AdminTokenResponse
	return out, c.do(ctx, http.MethodPost, "/v1/admin-tokens", AdminTokenRequest{Name: name}, &out)
}

// AdminTokens lists the admin tokens.
func (c *Client) AdminTokens(ctx context.Context) ([]AdminTokenView, error) {
	var out []AdminTokenView
	return out, c.do(ctx, http.MethodGet, "/v1/admin-tokens", nil, &out)
}

// RemoveAdminToken revokes a named admin token.
func (c *Client) RemoveAdminToken(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/admin-tokens/"+url.PathEscape(name), nil, nil)
}

// Audit lists the audit trail after seq after, at most limit (0: all).
func (c *Client) Audit(ctx context.Context, after uint64, limit int) ([]AuditView, error) {
	var out []AuditView
	return out, c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/audit?after=%d&limit=%d", after, limit), nil, &out)
}
