package redfish

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// serviceRoot is what the client reads of /redfish/v1.
type serviceRoot struct {
	Systems        link `json:"Systems"`
	Managers       link `json:"Managers"`
	SessionService link `json:"SessionService"`
	AccountService link `json:"AccountService"`
	UpdateService  link `json:"UpdateService"`
	Links          struct {
		Sessions link `json:"Sessions"`
	} `json:"Links"`
}

// or returns l's target, or def when the BMC did not name one.
func (l link) or(def string) string {
	if l.ID != "" {
		return l.ID
	}
	return def
}

// serviceRoot reads the unauthenticated service root (once).
func (c *Client) serviceRoot(ctx context.Context) (*serviceRoot, error) {
	if c.root != nil {
		return c.root, nil
	}
	root := &serviceRoot{}
	r, err := c.do(ctx, http.MethodGet, Root+"/", nil, nil, false)
	switch {
	case err == nil:
		if err := decode(r.body, root); err != nil {
			return nil, fmt.Errorf("redfish: service root: %w", err)
		}
	case rootNeedsAuth(err):
		// Quirk: the root should be readable without credentials; where it
		// is not, the standard paths are used.
	default:
		return nil, err
	}
	c.root = root
	return root, nil
}

// login opens a session (POST SessionService/Sessions, then X-Auth-Token on
// every request), or falls back to basic authentication when the BMC has
// no session service. Credentials the BMC refuses are an error, never a
// reason to try basic authentication.
func (c *Client) login(ctx context.Context) error {
	if c.loggedIn {
		return nil
	}
	if len(c.Username) == 0 || len(c.Password) == 0 {
		return errors.New("redfish: no credentials")
	}
	root, err := c.serviceRoot(ctx)
	if err != nil {
		return err
	}
	sessions := root.Links.Sessions.ID
	if sessions == "" && root.SessionService.ID != "" {
		sessions = Root + "/SessionService/Sessions"
	}
	if sessions == "" && root.Systems.ID == "" {
		sessions = Root + "/SessionService/Sessions" // the root was not readable
	}
	if sessions != "" {
		body := secretBody([]byte("UserName"), c.Username, []byte("Password"), c.Password)
		r, err := c.do(ctx, http.MethodPost, sessions, body, nil, false)
		clear(body)
		switch {
		case err == nil && r.header.Get("X-Auth-Token") != "":
			c.token = r.header.Get("X-Auth-Token")
			c.sessionPath = c.sessionLocation(r)
			c.loggedIn = true
			return nil
		case err != nil && credentialsRefused(err):
			return fmt.Errorf("redfish: the BMC refused the credentials: %w", err)
		case err != nil && !sessionsUnsupported(err):
			return fmt.Errorf("redfish: open a session: %w", err)
		}
	}
	c.basic = true
	c.loggedIn = true
	return nil
}

// sessionLocation is where the session can be deleted: the Location header,
// else the body's @odata.id; empty when neither stays under /redfish/v1.
func (c *Client) sessionLocation(r *response) string {
	for _, l := range []string{r.header.Get("Location"), idOf(r.body)} {
		if l == "" {
			continue
		}
		if p, q, err := resolveLink(c.host, l); err == nil && q == "" {
			return p
		}
	}
	return ""
}

func idOf(b []byte) string {
	var l link
	if decode(b, &l) != nil {
		return ""
	}
	return l.ID
}

// Close deletes the session, if one was opened, and drops idle connections.
// The client can log in again afterwards.
func (c *Client) Close(ctx context.Context) error {
	var err error
	if c.token != "" && c.sessionPath != "" {
		_, err = c.do(ctx, http.MethodDelete, c.sessionPath, nil, nil, true)
		if err != nil {
			err = fmt.Errorf("redfish: log out: %w", err)
		}
	}
	c.token, c.sessionPath = "", ""
	c.loggedIn, c.basic = false, false
	c.root, c.system = nil, ""
	if c.hc != nil {
		c.hc.CloseIdleConnections()
	}
	return err
}

// Authenticated reports how the client authenticates: "session", "basic",
// or "" before the first operation.
func (c *Client) Authenticated() string {
	switch {
	case c.token != "":
		return "session"
	case c.basic:
		return "basic"
	}
	return ""
}
