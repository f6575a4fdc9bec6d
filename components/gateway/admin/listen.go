package admin

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/trust/identity"
)

func (s *API) Listeners() (*http.Server, []net.Listener, error) {
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
	s.secretRoutes(mux)
	mux.HandleFunc("GET /v1/nodes/{id}/status", s.adminStatus)
	mux.HandleFunc("GET /v1/nodes/{id}/events", s.adminEvents)
	mux.HandleFunc("GET /v1/nodes/{id}/spec", s.adminSpec)
	mux.HandleFunc("POST /v1/nodes/{id}/holds", s.adminHold)
	mux.HandleFunc("POST /v1/ssh/ca", s.adminSSHCA)
	mux.HandleFunc("POST /v1/nodes/{id}/tunnel", s.adminTunnel)
	mux.HandleFunc("POST /v1/instances/{instance}/tunnel", s.adminTunnel)
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
	mux.HandleFunc("POST /v1/page/link", s.adminPageLink)
	mux.HandleFunc("POST /v1/admin-tokens", s.adminCreateAdminToken)
	mux.HandleFunc("GET /v1/admin-tokens", s.adminListAdminTokens)
	mux.HandleFunc("DELETE /v1/admin-tokens/{name}", s.adminRemoveAdminToken)
	mux.HandleFunc("GET /v1/audit", s.adminAudit)
	mux.HandleFunc("DELETE /v1/nodes/{id}", s.adminRemoveNode)
	mux.HandleFunc("POST /v1/trust/rotate-key", s.adminRotateCommandKey)
	mux.HandleFunc("GET /v1/backup", s.adminBackup)
	mux.HandleFunc("POST /v1/serving/renew", s.adminRenewServing)
	mux.HandleFunc("GET /v1/tokens", s.adminJoinTokens)
	mux.HandleFunc("DELETE /v1/tokens/{id}", s.adminRemoveJoinToken)
	mux.HandleFunc("GET /fleet", s.fleetPage)
	mux.HandleFunc("GET /fleet/login", s.pageLogin)
	mux.HandleFunc("GET /v1/well-known", func(w http.ResponseWriter, r *http.Request) {
		d, err := s.cfg.WellKnown()
		if err != nil {
			adminErr(w, http.StatusInternalServerError, err)
			return
		}
		writeJSON(w, d)
	})
	var lns []net.Listener
	ul, err := ListenPrivate(filepath.Join(s.cfg.DataDir, adminapi.AdminSocket), s.cfg.BoundAside)
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
		actor := SocketActor
		if _, tcp := r.Context().Value(tcpConnKey{}).(bool); tcp {
			var ok bool
			if actor, ok = s.authenticate(r, bearer); !ok {
				if r.URL.Path == "/fleet" || r.URL.Path == "/fleet/login" {
					pageRefused(w, "no admin token came with this request")
					return
				}
				adminErr(w, http.StatusUnauthorized, errors.New("bearer token required: send Authorization: Bearer <the token in DATA/admin.token, or a named admin token>"))
				return
			}
		}
		r = r.WithContext(context.WithValue(r.Context(), actorKey{}, actor))
		if !audited(r) {
			mux.ServeHTTP(w, r)
			return
		}
		aw := &auditWriter{ResponseWriter: w}
		mux.ServeHTTP(aw, r)
		s.record(r, aw)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ConnContext: func(ctx context.Context, c net.Conn) context.Context {
		if _, ok := c.(bearerConn); ok {
			return context.WithValue(ctx, tcpConnKey{}, true)
		}
		return ctx
	}}
	return srv, lns, nil
}

// ListenPrivate listens on the unix socket sock with mode 0600 from the
// moment it exists at that path, whatever the process umask: it binds in
// a fresh 0700 directory beside sock, sets the mode there and renames the
// socket into place (the listener keeps the same inode). aside, when set,
// is called with the socket's first path once it is bound (tests).
func ListenPrivate(sock string, aside func(path string)) (net.Listener, error) {
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
func (s *API) AdminURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.admin
}

type tcpConnKey struct{}

type actorKey struct{}

// SocketActor is who a call over the admin socket is: the account that
// may open it (the socket needs no token).
const SocketActor = "socket"

// DefaultTokenName names the token bcgw serve writes to DATA/admin.token.
const DefaultTokenName = "default"

// actorOf is the name of who made the request.
func actorOf(r *http.Request) string {
	if a, ok := r.Context().Value(actorKey{}).(string); ok {
		return a
	}
	return SocketActor
}

// authenticate names who a request on the loopback listener comes from:
// the admin token in its Authorization header; or, for the fleet page
// only, its session cookie or a one-time link (which the login spends).
func (s *API) authenticate(r *http.Request, bearer string) (string, bool) {
	if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if subtle.ConstantTimeCompare([]byte(got), []byte(bearer)) == 1 {
			return DefaultTokenName, true
		}
		return s.namedToken(got)
	}
	if r.Method != http.MethodGet {
		return "", false
	}
	switch r.URL.Path {
	case "/fleet/login":
		return "", r.URL.Query().Get("code") != ""
	case "/fleet":
		return s.pageSession(r)
	}
	return "", false
}

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
