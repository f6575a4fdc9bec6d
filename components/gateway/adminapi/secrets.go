package adminapi

import (
	"context"
	"net/http"
)

// SecretRequest sets (PUT /v1/secrets) or deletes (DELETE /v1/secrets)
// an operator secret: Name is telemetry-header/<Header-Name>, Node a node
// id or empty for the fleet. Value is only in a PUT; the gateway stores
// it sealed and never shows it again.
type SecretRequest struct {
	Name  string `json:"name"`
	Node  string `json:"node,omitempty"`
	Value string `json:"value,omitempty"`
}

// SecretView is an operator secret as GET /v1/secrets lists it: its
// canonical name and its node (empty: the fleet), never its value.
type SecretView struct {
	Name string `json:"name"`
	Node string `json:"node,omitempty"`
}

// SetSecret stores an operator secret and returns its canonical name.
func (c *Client) SetSecret(ctx context.Context, name, node string, value []byte) (string, error) {
	var out SecretView
	err := c.do(ctx, http.MethodPut, "/v1/secrets", SecretRequest{Name: name, Node: node, Value: string(value)}, &out)
	return out.Name, err
}

// DeleteSecret removes an operator secret and returns its canonical name.
func (c *Client) DeleteSecret(ctx context.Context, name, node string) (string, error) {
	var out SecretView
	err := c.do(ctx, http.MethodDelete, "/v1/secrets", SecretRequest{Name: name, Node: node}, &out)
	return out.Name, err
}

// Secrets lists the operator secrets without their values.
func (c *Client) Secrets(ctx context.Context) ([]SecretView, error) {
	var out []SecretView
	err := c.do(ctx, http.MethodGet, "/v1/secrets", nil, &out)
	return out, err
}
