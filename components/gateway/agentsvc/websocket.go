package agentsvc

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/wsproof"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// The WebSocket fallback (docs/protocol.md#the-websocket-fallback): for
// agents behind a proxy that terminates TLS and strips client
// certificates. The session carries the same frames as the Session RPC,
// one protobuf message per binary WebSocket message; the node proves its
// key over the gateway's challenge instead of presenting its certificate
// in TLS, and the gateway proves its join-signing key over the agent's
// nonce. Renewals take the same proof over HTTP (POST RenewPath).

// Paths of the fallback on the agents' port.
const (
	SessionPath   = "/v1/session"
	ChallengePath = "/v1/challenge"
	RenewPath     = "/v1/renew"
)

// wsPing is how often the gateway pings a fallback session; a pong later
// than wsPingTimeout ends it (HTTP/2 pings do this for the RPC).
const (
	wsPing        = 20 * time.Second
	wsPingTimeout = 15 * time.Second
	wsWriteWait   = 30 * time.Second
)

// issuer is the fallback's challenge issuer. Its MAC key derives from the
// join-signing key, which every gateway of a fleet shares, so a challenge
// one gateway issued is answered at another.
func (s *Service) issuer() *wsproof.Issuer {
	s.wsOnce.Do(func() {
		der, err := x509.MarshalPKCS8PrivateKey(s.keys.JoinSigning)
		if err != nil {
			// A key that cannot be marshalled: a key of this process alone.
			der = []byte(fleet.RandomID(32))
		}
		mk := sha256.Sum256(append([]byte("bcd-ws-challenge-mac\x00"), der...))
		s.ws = wsproof.NewIssuer(s.keys.JoinSigning, s.keys.SigningSPKI, mk[:], s.now)
	})
	return s.ws
}

// agentNonce reads the agent's nonce from the nonce query parameter.
func agentNonce(r *http.Request) ([]byte, error) {
	n, err := base64.RawURLEncoding.DecodeString(r.URL.Query().Get("nonce"))
	if err != nil || len(n) != wsproof.NonceSize {
		return nil, fmt.Errorf("nonce must be %d bytes, unpadded base64url", wsproof.NonceSize)
	}
	return n, nil
}

// provenNode checks a node proof for purpose over the challenge, nonce
// and body: the certificate is one the node CA issued for client use, its
// key signed, the challenge is ours, fresh and unspent (it is spent now),
// and the certificate names a node of this gateway.
func (s *Service) provenNode(p wsproof.Proof, challenge, nonce, body []byte, purpose string) (store.Node, *x509.Certificate, error) {
	cert, err := x509.ParseCertificate(p.Certificate)
	if err != nil {
		return store.Node{}, nil, connectErr(connect.CodeUnauthenticated, "node proof: certificate: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.keys.NodeCA.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: s.now()}); err != nil {
		return store.Node{}, nil, connectErr(connect.CodeUnauthenticated, "node proof: certificate: %v", err)
	}
	c := wsproof.Challenge{Challenge: challenge}
	if err := wsproof.VerifyNode(cert, p, purpose, c, nonce, body); err != nil {
		return store.Node{}, nil, connectErr(connect.CodeUnauthenticated, "%v", err)
	}
	if err := s.issuer().Spend(challenge); err != nil {
		return store.Node{}, nil, connectErr(connect.CodeUnauthenticated, "node proof: %v", err)
	}
	return s.nodeOfCert(cert)
}

// ServeChallenge answers GET ChallengePath?nonce=: a challenge for a
// renewal, with the gateway's proof.
func (s *Service) ServeChallenge(w http.ResponseWriter, r *http.Request) {
	nonce, err := agentNonce(r)
	if err != nil {
		httpErr(w, connectErr(connect.CodeInvalidArgument, "%v", err))
		return
	}
	c, err := s.issuer().Issue(nonce)
	if err != nil {
		httpErr(w, connectErr(connect.CodeInternal, "challenge: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(c)
}

// ServeRenew answers POST RenewPath: a renewal proven by the node proof
// (wsproof.RenewBody), answered with the JoinResponse as protobuf.
func (s *Service) ServeRenew(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, wsproof.MaxRenewBody+1))
	if err != nil {
		return
	}
	var rb wsproof.RenewBody
	if len(b) > wsproof.MaxRenewBody {
		httpErr(w, connectErr(connect.CodeInvalidArgument, "renewal larger than %d bytes", wsproof.MaxRenewBody))
		return
	}
	if err := wsproof.DecodeRenew(b, &rb); err != nil {
		httpErr(w, connectErr(connect.CodeInvalidArgument, "renewal: %v", err))
		return
	}
	var req bcdv1.RenewRequest
	if err := proto.Unmarshal(rb.Request, &req); err != nil {
		httpErr(w, connectErr(connect.CodeInvalidArgument, "renewal request: %v", err))
		return
	}
	n, cert, err := s.provenNode(rb.Proof, rb.Challenge, rb.Nonce, rb.Request, wsproof.PurposeRenew)
	if err != nil {
		s.log.Warn("renewal over the WebSocket fallback refused", "err", err)
		httpErr(w, err)
		return
	}
	resp, err := s.renew(n, cert, &req)
	if err != nil {
		httpErr(w, err)
		return
	}
	out, err := proto.Marshal(resp)
	if err != nil {
		httpErr(w, connectErr(connect.CodeInternal, "%v", err))
		return
	}
	w.Header().Set("Content-Type", "application/proto")
	_, _ = w.Write(out)
}

// httpErr answers err (a connect error) as wsproof.HTTPError.
func httpErr(w http.ResponseWriter, err error) {
	code := connect.CodeOf(err)
	var ce *connect.Error
	msg := err.Error()
	if errors.As(err, &ce) {
		msg = ce.Message()
		if v := ce.Meta().Get("grpc-retry-pushback-ms"); v != "" {
			w.Header().Set(wsproof.PushbackHeader, v)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(wsproof.HTTPStatus(uint32(code)))
	_ = json.NewEncoder(w).Encode(wsproof.HTTPError{Code: code.String(), Error: msg})
}

// ServeWebSocket serves GET SessionPath?nonce=: the gateway's challenge
// and proof, the node's proof, then the session's frames.
func (s *Service) ServeWebSocket(w http.ResponseWriter, r *http.Request) {
	nonce, err := agentNonce(r)
	if err != nil {
		httpErr(w, connectErr(connect.CodeInvalidArgument, "%v", err))
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		s.log.Debug("WebSocket upgrade failed", "err", err)
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(5 << 20)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, err := s.issuer().Issue(nonce)
	if err != nil {
		closeWith(c, connectErr(connect.CodeInternal, "challenge: %v", err))
		return
	}
	b, _ := json.Marshal(ch)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	err = c.Write(wctx, websocket.MessageText, b)
	if err == nil {
		var typ websocket.MessageType
		typ, b, err = c.Read(wctx)
		if err == nil && typ != websocket.MessageText {
			err = errors.New("the node proof must be a text message")
		}
	}
	wcancel()
	if err != nil {
		s.log.Debug("WebSocket fallback: no node proof", "err", err)
		return
	}
	var p wsproof.Proof
	if err := wsproof.Decode(b, &p); err != nil {
		closeWith(c, connectErr(connect.CodeInvalidArgument, "node proof: %v", err))
		return
	}
	n, cert, err := s.provenNode(p, ch.Challenge, nonce, nil, wsproof.PurposeSession)
	if err != nil {
		s.log.Warn("session over the WebSocket fallback refused", "err", err)
		closeWith(c, err)
		return
	}
	go func() {
		t := time.NewTicker(wsPing)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				pctx, pcancel := context.WithTimeout(ctx, wsPingTimeout)
				err := c.Ping(pctx)
				pcancel()
				if err != nil {
					cancel()
					return
				}
			}
		}
	}()
	release, ok := s.setups.enter(ctx)
	if ok {
		err = s.serve(ctx, n, cert, &wsStream{ctx: ctx, c: c}, true, release)
	} else {
		err = s.setupBusy()
	}
	release()
	closeWith(c, err)
}

// closeWith ends a fallback session: normally when err is nil, else with
// the error's code (wsproof.CloseCode) and message, and a busy refusal's
// pushback.
func closeWith(c *websocket.Conn, err error) {
	if err == nil {
		_ = c.Close(websocket.StatusNormalClosure, "")
		return
	}
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
		if v := ce.Meta().Get("grpc-retry-pushback-ms"); v != "" {
			if ms, perr := strconv.ParseInt(v, 10, 64); perr == nil {
				msg = wsproof.PushbackReason(ms, msg)
			}
		}
	}
	_ = c.Close(websocket.StatusCode(wsproof.CloseCode(uint32(connect.CodeOf(err)))), wsproof.TrimReason(msg))
}

// wsStream is a session's frames over the fallback.
type wsStream struct {
	ctx context.Context
	c   *websocket.Conn
}

func (w *wsStream) Send(f *bcdv1.GatewayFrame) error {
	b, err := proto.Marshal(f)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(w.ctx, wsWriteWait)
	defer cancel()
	return w.c.Write(ctx, websocket.MessageBinary, b)
}

func (w *wsStream) Receive() (*bcdv1.AgentFrame, error) {
	typ, b, err := w.c.Read(w.ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageBinary {
		return nil, connectErr(connect.CodeInvalidArgument, "frames are binary messages")
	}
	var f bcdv1.AgentFrame
	if err := proto.Unmarshal(b, &f); err != nil {
		return nil, connectErr(connect.CodeInvalidArgument, "frame: %v", err)
	}
	return &f, nil
}
