// Package imds is the VPS host's instance metadata service, on [imds]
// listen: an instance asks `PUT /latest/api/token` for a session token,
// bound to the instance that holds the request's source address under the
// loaded network policy, then `GET /latest/identity-token?audience=` with
// it for a workload token (the gateway's JWT for that audience and
// instance, through the session's WorkloadTokenRequest). It answers only
// an address the loaded tables bind to a running instance (so nothing
// while they are being loaded again), refuses forwarded requests (a
// Forwarded, X-Forwarded-For, X-Real-IP or Via header), and answers every
// connection with a hop limit of 1, so an answer cannot travel past the
// instance that asked. On an EC2 host it refuses to listen on AWS's own
// metadata addresses. docs/instances.md, "The metadata service",
// describes it.
package imds

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper/netpolicy"
)

// Headers of the protocol (EC2's IMDSv2 names).
const (
	TokenHeader    = "X-aws-ec2-metadata-token"
	TokenTTLHeader = "X-aws-ec2-metadata-token-ttl-seconds"
)

// Bounds.
const (
	MaxTokenTTL  = 6 * time.Hour
	MaxSessions  = 4096
	MaxAudience  = 256
	tokenBytes   = 32
	maxHeaderLen = 8 << 10
)

// Owners says which running instance holds an address under the loaded
// tables (netguard.Guard).
type Owners interface {
	Owner(a netip.Addr) (instance string, ok bool)
}

// Tokens gets a workload token for audience, naming instance.
type Tokens func(ctx context.Context, instance, audience string) (string, error)

// Server is the metadata service.
type Server struct {
	owners Owners
	tokens Tokens
	log    *slog.Logger
	now    func() time.Time

	mu       sync.Mutex
	sessions map[string]session
}

type session struct {
	instance string
	expires  time.Time
}

// New returns the service over owners and tokens.
func New(owners Owners, tokens Tokens, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{owners: owners, tokens: tokens, log: log, now: time.Now, sessions: map[string]session{}}
}

// CheckListen refuses addr on an EC2 host when it is one of AWS's
// metadata addresses: bound there, bcd's service would make the address
// local and the host's own reads of AWS's service would reach bcd's.
func CheckListen(addr string, ec2 bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("[imds] listen %q: %w", addr, err)
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("[imds] listen %q: the host must be an IP address", addr)
	}
	if ec2 {
		for _, m := range netpolicy.EC2Metadata {
			if a.Unmap() == m {
				return fmt.Errorf("[imds] listen %q is EC2's own instance metadata service on this EC2 host; serve the instances' metadata on another address, such as the host's address on the instances' bridge", addr)
			}
		}
	}
	return nil
}

// Listen listens on addr (after CheckListen) with a hop limit of 1 on
// every connection it accepts: an answer reaches the instance that asked
// and goes no further (a guest forwarding or NATing for another machine
// cannot pass it on).
func Listen(ctx context.Context, addr string, ec2 bool) (net.Listener, error) {
	if err := CheckListen(addr, ec2); err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: func(network, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if strings.HasSuffix(network, "6") {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL, 1)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(ctx, "tcp", addr)
}

// Serve serves l until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: maxHeaderLen}
	go func() {
		<-ctx.Done()
		hs.Close()
	}()
	err := hs.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ServeHTTP answers one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Cache-Control", "no-store")
	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Real-Ip", "Via"} {
		if r.Header.Get(h) != "" {
			s.refuse(w, r, http.StatusForbidden, "forwarded requests are refused", "", "header", h)
			return
		}
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		s.refuse(w, r, http.StatusForbidden, "the request's source is not an instance of this host", "")
		return
	}
	src := ap.Addr().Unmap()
	instance, ok := s.owners.Owner(src)
	if !ok {
		s.refuse(w, r, http.StatusForbidden, "the request's source is not an instance of this host", "", "source", src.String())
		return
	}
	switch r.URL.Path {
	case "/latest/api/token":
		if r.Method != http.MethodPut {
			s.refuse(w, r, http.StatusMethodNotAllowed, "PUT a session token request", instance)
			return
		}
		s.token(w, r, instance)
	case "/latest/identity-token":
		if r.Method != http.MethodGet {
			s.refuse(w, r, http.StatusMethodNotAllowed, "GET an identity token", instance)
			return
		}
		s.identity(w, r, instance)
	default:
		s.refuse(w, r, http.StatusNotFound, "not found", instance)
	}
}

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, msg, instance string, attrs ...any) {
	s.log.Info("imds: refused", append([]any{"path", r.URL.Path, "code", code, "reason", msg, "instance", instance}, attrs...)...)
	http.Error(w, msg, code)
}

// token is PUT /latest/api/token: a session token for the calling
// instance, valid for the TTL asked (1 s to 6 h).
func (s *Server) token(w http.ResponseWriter, r *http.Request, instance string) {
	ttl, err := strconv.Atoi(r.Header.Get(TokenTTLHeader))
	if err != nil || ttl < 1 || time.Duration(ttl)*time.Second > MaxTokenTTL {
		s.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("%s must be 1 to %d seconds", TokenTTLHeader, int(MaxTokenTTL.Seconds())), instance)
		return
	}
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		http.Error(w, "no token", http.StatusInternalServerError)
		return
	}
	tok := base64.RawURLEncoding.EncodeToString(b)
	now := s.now()
	s.mu.Lock()
	for k, v := range s.sessions {
		if !now.Before(v.expires) {
			delete(s.sessions, k)
		}
	}
	if len(s.sessions) >= MaxSessions {
		s.mu.Unlock()
		s.refuse(w, r, http.StatusServiceUnavailable, "too many sessions; try again later", instance)
		return
	}
	s.sessions[tok] = session{instance: instance, expires: now.Add(time.Duration(ttl) * time.Second)}
	s.mu.Unlock()
	w.Header().Set(TokenTTLHeader, strconv.Itoa(ttl))
	fmt.Fprint(w, tok)
}

// identity is GET /latest/identity-token?audience=: a workload token for
// the audience, for the instance the session token was issued to, which
// must still hold the request's source address.
func (s *Server) identity(w http.ResponseWriter, r *http.Request, instance string) {
	tok := r.Header.Get(TokenHeader)
	s.mu.Lock()
	sess, ok := s.sessions[tok]
	s.mu.Unlock()
	if tok == "" || !ok || !s.now().Before(sess.expires) {
		s.refuse(w, r, http.StatusUnauthorized, "a valid session token is required (PUT /latest/api/token)", instance)
		return
	}
	if sess.instance != instance {
		s.refuse(w, r, http.StatusForbidden, "the session token belongs to another instance", instance)
		return
	}
	audience := r.URL.Query().Get("audience")
	if audience == "" || len(audience) > MaxAudience || strings.ContainsFunc(audience, func(c rune) bool { return !unicode.IsPrint(c) || unicode.IsSpace(c) }) {
		s.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("audience must be 1 to %d printable characters without spaces", MaxAudience), instance)
		return
	}
	jwt, err := s.tokens(r.Context(), instance, audience)
	if err != nil {
		s.log.Warn("imds: no workload token", "instance", instance, "audience", audience, "error", err)
		http.Error(w, "no identity token: the gateway did not answer", http.StatusBadGateway)
		return
	}
	s.log.Info("imds: identity token", "instance", instance, "audience", audience)
	fmt.Fprint(w, jwt)
}
