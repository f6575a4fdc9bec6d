package adminapi

import (
	"context"
	"net/http"
	"time"
)

// PageLink is a one-time link to the fleet page: opened once (within its
// expiry), it sets the page's session cookie and shows the page.
type PageLink struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// PageLink asks for a one-time link to the fleet page.
func (c *Client) PageLink(ctx context.Context) (PageLink, error) {
	var out PageLink
	return out, c.do(ctx, http.MethodPost, "/v1/page/link", nil, &out)
}
