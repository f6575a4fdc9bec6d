package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
)

func (s *API) adminToken(w http.ResponseWriter, r *http.Request) {
	var req adminapi.TokenRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	var tok string
	var rec store.Token
	var err error
	if req.CloudRegion != "" && req.CloudAccount == "" {
		adminErr(w, http.StatusBadRequest, errors.New("cloud_iid_region needs cloud_iid_account"))
		return
	}
	if req.CloudAccount != "" {
		rec, err := s.NewCloudRule(req.Role, req.Site, req.CloudAccount, req.CloudRegion, req.Uses, time.Duration(req.TTLSeconds)*time.Second)
		if err != nil {
			adminErr(w, http.StatusBadRequest, err)
			return
		}
		writeJSON(w, adminapi.TokenResponse{ID: rec.ID, ExpiresAt: rec.ExpiresAt})
		return
	}
	if req.NodeID != "" {
		if (req.Role != "" && req.Role != "node") || req.Uses > 1 {
			adminErr(w, http.StatusBadRequest, errors.New("a provisioned token (node_id) is of role node and admits one join"))
			return
		}
		tok, rec, err = s.NewProvisionedToken(req.Site, req.NodeID, time.Duration(req.TTLSeconds)*time.Second)
	} else {
		tok, rec, err = s.NewToken(req.Role, req.Site, req.Uses, time.Duration(req.TTLSeconds)*time.Second)
	}
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	auditTarget(w, rec.ID)
	writeJSON(w, adminapi.TokenResponse{Token: tok, ID: rec.ID, ExpiresAt: rec.ExpiresAt})
}

func (s *API) adminNodes(w http.ResponseWriter, r *http.Request) {
	out, err := s.nodeViews()
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, out)
}

// nodeViews is every node as the admin API lists it.
func (s *API) nodeViews() ([]adminapi.NodeView, error) {
	nodes, err := s.store.Nodes()
	if err != nil {
		return nil, err
	}
	out := make([]adminapi.NodeView, 0, len(nodes))
	for _, n := range nodes {
		on, connected := s.SessionOn(n)
		out = append(out, adminapi.NodeView{ID: n.ID, Role: n.Role, Site: n.Site, Hostname: n.Hostname, Connected: connected, Gateway: on,
			BootLease: n.Role == "site" && s.BootLeaseHolder(n.Site) == n.ID,
			Epoch:     n.Epoch, Revoked: n.Revoked, LastSeen: n.LastSeen, NotAfter: n.NotAfter, AK: n.AK, Version: n.Version})
	}
	return out, nil
}

func (s *API) adminRevoke(w http.ResponseWriter, r *http.Request) {
	if err := s.Revoke(r.PathValue("id")); err != nil {
		adminErr(w, errCode(err, http.StatusInternalServerError), err)
		return
	}
	writeJSON(w, map[string]bool{"revoked": true})
}

func (s *API) adminSend(w http.ResponseWriter, r *http.Request) {
	var req adminapi.CommandRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	if len(req.Body) > 0 && !json.Valid(req.Body) {
		adminErr(w, http.StatusBadRequest, errors.New("body is not JSON"))
		return
	}
	secrets, err := commandSecrets(req.Kind, req.UserData, req.SecretHeaders)
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	c, err := s.SendCommandWithSecrets(req.Node, req.Kind, req.Body, time.Duration(req.DeadlineSeconds)*time.Second, secrets)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	v := fleet.ViewCommand(c)
	v.Warning = s.UnbatchedWarning(c.Kind)
	writeJSON(w, v)
}

// commandSecrets checks deploy.image's user data and site.httpProxy's
// secret headers and makes them the command's secrets (nil without
// either). Errors name what is wrong, never a value.
func commandSecrets(kind string, userData []byte, headers map[string]string) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(userData) > 0 {
		if kind != "deploy.image" {
			return nil, errors.New("user data goes with deploy.image only")
		}
		if len(userData) > fleet.MaxUserData {
			return nil, fmt.Errorf("user data is larger than %d bytes", fleet.MaxUserData)
		}
		out[fleet.SecretUserData] = userData
	}
	if len(headers) > 0 && kind != "site.httpProxy" {
		return nil, errors.New("secret headers go with site.httpProxy only")
	}
	if len(headers) > 16 {
		return nil, errors.New("at most 16 secret headers")
	}
	for name, v := range headers {
		if name == "" || len(name) > 64 || strings.ContainsAny(name, " :\r\n\t\x00") {
			return nil, fmt.Errorf("secret header name %q is not an HTTP header name", clipName(name))
		}
		if len(v) > 8192 || strings.ContainsAny(v, "\r\n\x00") {
			return nil, fmt.Errorf("secret header %s: the value has a line break or NUL, or is over 8 KiB", http.CanonicalHeaderKey(name))
		}
		out[fleet.SecretHTTPHeader+http.CanonicalHeaderKey(name)] = []byte(v)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func clipName(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func (s *API) adminCommand(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	wait, _ := strconv.Atoi(r.URL.Query().Get("wait"))
	end := time.Now().Add(time.Duration(min(max(wait, 0), 600)) * time.Second)
	for {
		// Registered before the read, so a result stored in between wakes it.
		woke, cancel := s.WaitResult(id)
		c, err := s.store.Command(id)
		if err != nil {
			cancel()
			adminErr(w, errCode(err, http.StatusInternalServerError), fmt.Errorf("command %s: %w", id, err))
			return
		}
		left := time.Until(end)
		if c.State == store.StateDone || left <= 0 {
			cancel()
			writeJSON(w, s.WithProgress(fleet.ViewCommand(c)))
			return
		}
		select {
		case <-r.Context().Done():
			cancel()
			return
		case <-woke:
		case <-time.After(left):
			cancel()
		}
	}
}
