package gateway

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/identity"
)

func (s *Server) adminListeners() (*http.Server, []net.Listener, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/tokens", s.adminToken)
	mux.HandleFunc("GET /v1/nodes", s.adminNodes)
	mux.HandleFunc("GET /v1/health", s.adminHealth)
	mux.HandleFunc("PUT /v1/releases/uploads/{sha256}", s.adminUploadArtifact)
	mux.HandleFunc("POST /v1/releases", s.adminPublishRelease)
	mux.HandleFunc("GET /v1/releases", s.adminReleases)
	mux.HandleFunc("GET /v1/releases/{version}", s.adminReleaseDoc)
	mux.HandleFunc("POST /v1/tpm/enroll", s.adminTPMEnroll)
	mux.HandleFunc("POST /v1/nodes/{id}/revoke", s.adminRevoke)
	mux.HandleFunc("POST /v1/commands", s.adminSend)
	mux.HandleFunc("POST /v1/commands/prepare", s.adminPrepareCommand)
	mux.HandleFunc("POST /v1/commands/submit", s.adminSubmitCommand)
	mux.HandleFunc("POST /v1/nodes/{id}/spec/prepare", s.adminPrepareSpec)
	mux.HandleFunc("POST /v1/nodes/{id}/spec/submit", s.adminSubmitSpec)
	mux.HandleFunc("GET /v1/trust", s.adminTrust)
	mux.HandleFunc("POST /v1/trust/roots", s.adminTrustRoot(false))
	mux.HandleFunc("POST /v1/trust/roots/remove", s.adminTrustRoot(true))
	mux.HandleFunc("POST /v1/trust/approvers", s.adminSetApprovers)
	mux.HandleFunc("POST /v1/batches/submit", s.adminSubmitBatch)
	mux.HandleFunc("POST /v1/bmc", s.adminBMC)
	mux.HandleFunc("GET /v1/nodes/{id}/status", s.adminStatus)
	mux.HandleFunc("GET /v1/nodes/{id}/events", s.adminEvents)
	mux.HandleFunc("GET /v1/nodes/{id}/spec", s.adminSpec)
	mux.HandleFunc("POST /v1/nodes/{id}/holds", s.adminHold)
	mux.HandleFunc("POST /v1/ssh/ca", s.adminSSHCA)
	mux.HandleFunc("POST /v1/nodes/{id}/tunnel", s.adminTunnel)
	mux.HandleFunc("POST /v1/ssh/sign", s.adminSSHSign)
	mux.HandleFunc("DELETE /v1/nodes/{id}/holds/{alloc}", s.adminRelease)
	mux.HandleFunc("PUT /v1/nodes/{id}/spec", s.adminSetSpec)
	mux.HandleFunc("PATCH /v1/nodes/{id}/spec", s.adminSetSpec)
	mux.HandleFunc("POST /v1/nodes/{id}/cache-images", s.adminCacheImages)
	mux.HandleFunc("GET /v1/commands/{id}", s.adminCommand)
	mux.HandleFunc("POST /v1/commands/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Reason string `json:"reason"`
		}
		if r.ContentLength != 0 {
			if err := decodeBody(r, &req); err != nil {
				adminErr(w, http.StatusBadRequest, err)
				return
			}
		}
		c, err := s.CancelCommand(r.PathValue("id"), req.Reason)
		if err != nil {
			adminErr(w, errCode(err, http.StatusInternalServerError), err)
			return
		}
		writeJSON(w, fleet.ViewCommand(c))
	})
	mux.HandleFunc("GET /v1/well-known", func(w http.ResponseWriter, r *http.Request) {
		d, err := s.WellKnown()
		if err != nil {
			adminErr(w, http.StatusInternalServerError, err)
			return
		}
		writeJSON(w, d)
	})
	var lns []net.Listener
	ul, err := listenPrivate(filepath.Join(s.cfg.DataDir, adminapi.AdminSocket), s.cfg.boundAside)
	if err != nil {
		return nil, nil, err
	}
	lns = append(lns, ul)
	var bearer string
	if s.cfg.AdminListen != "" {
		host, _, err := net.SplitHostPort(s.cfg.AdminListen)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			ul.Close()
			return nil, nil, fmt.Errorf("--admin-listen must be a loopback address")
		}
		bearer = fleet.RandomID(24)
		if err := identity.WriteFileAtomic(filepath.Join(s.cfg.DataDir, adminapi.AdminTokenFile), []byte(bearer+"\n"), 0o600); err != nil {
			ul.Close()
			return nil, nil, err
		}
		tl, err := net.Listen("tcp", s.cfg.AdminListen)
		if err != nil {
			ul.Close()
			return nil, nil, fmt.Errorf("listen %s: %w", s.cfg.AdminListen, err)
		}
		s.mu.Lock()
		s.admin = "http://" + tl.Addr().String()
		s.mu.Unlock()
		lns = append(lns, bearerListener{Listener: tl})
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, tcp := r.Context().Value(tcpConnKey{}).(bool); tcp {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(bearer)) != 1 {
				adminErr(w, http.StatusUnauthorized, errors.New("bearer token required: send Authorization: Bearer <the token in DATA/admin.token>"))
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ConnContext: func(ctx context.Context, c net.Conn) context.Context {
		if _, ok := c.(bearerConn); ok {
			return context.WithValue(ctx, tcpConnKey{}, true)
		}
		return ctx
	}}
	return srv, lns, nil
}

// listenPrivate listens on the unix socket sock with mode 0600 from the
// moment it exists at that path, whatever the process umask: it binds in
// a fresh 0700 directory beside sock, sets the mode there and renames the
// socket into place (the listener keeps the same inode). aside, when set,
// is called with the socket's first path once it is bound (tests).
func listenPrivate(sock string, aside func(path string)) (net.Listener, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(sock), ".bind-")
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", sock, err)
	}
	defer os.RemoveAll(tmp)
	first := filepath.Join(tmp, filepath.Base(sock))
	l, err := net.Listen("unix", first)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", sock, err)
	}
	ul := l.(*net.UnixListener)
	// The socket file is renamed away from where it was bound: closing
	// the listener must not remove whatever is at the first path then.
	ul.SetUnlinkOnClose(false)
	if aside != nil {
		aside(first)
	}
	if err := os.Chmod(first, 0o600); err != nil {
		ul.Close()
		return nil, fmt.Errorf("chmod %s: %w", first, err)
	}
	if err := os.Rename(first, sock); err != nil {
		ul.Close()
		return nil, fmt.Errorf("rename %s to %s: %w", first, sock, err)
	}
	return &unlinkListener{UnixListener: ul, path: sock}, nil
}

// unlinkListener removes its socket file when closed, as a listener that
// bound at that path would.
type unlinkListener struct {
	*net.UnixListener
	path string
	once sync.Once
}

func (l *unlinkListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() { _ = os.Remove(l.path) })
	return err
}

// AdminURL is the loopback admin address when --admin-listen is set.
func (s *Server) AdminURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.admin
}

type tcpConnKey struct{}

// bearerListener marks its connections as needing the bearer token.
type bearerListener struct{ net.Listener }

type bearerConn struct{ net.Conn }

func (l bearerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return bearerConn{c}, nil
}

// errCode is 404 for what the store does not have, else def.
func errCode(err error, def int) int {
	if errors.Is(err, store.ErrNotFound) {
		return http.StatusNotFound
	}
	return def
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func adminErr(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 2<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

func (s *Server) adminToken(w http.ResponseWriter, r *http.Request) {
	var req adminapi.TokenRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	var tok string
	var rec store.Token
	var err error
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
	writeJSON(w, adminapi.TokenResponse{Token: tok, ID: rec.ID, ExpiresAt: rec.ExpiresAt})
}

func (s *Server) adminNodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := s.store.Nodes()
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	out := make([]adminapi.NodeView, 0, len(nodes))
	for _, n := range nodes {
		on, connected := s.SessionOn(n)
		out = append(out, adminapi.NodeView{ID: n.ID, Role: n.Role, Site: n.Site, Hostname: n.Hostname, Connected: connected, Gateway: on,
			BootLease: n.Role == "site" && s.BootLeaseHolder(n.Site) == n.ID,
			Epoch:     n.Epoch, Revoked: n.Revoked, LastSeen: n.LastSeen, NotAfter: n.NotAfter, AK: n.AK})
	}
	writeJSON(w, out)
}

func (s *Server) adminRevoke(w http.ResponseWriter, r *http.Request) {
	if err := s.Revoke(r.PathValue("id")); err != nil {
		adminErr(w, errCode(err, http.StatusInternalServerError), err)
		return
	}
	writeJSON(w, map[string]bool{"revoked": true})
}

func (s *Server) adminSend(w http.ResponseWriter, r *http.Request) {
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

func (s *Server) adminCommand(w http.ResponseWriter, r *http.Request) {
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
