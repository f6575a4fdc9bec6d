package transport

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/wsproof"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// fakeGateway answers the fallback's challenge with issuer's proof, and
// records whether a node proof came.
func fakeGateway(t *testing.T, iss *wsproof.Issuer) (*httptest.Server, *bool) {
	t.Helper()
	proved := false
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/session", func(w http.ResponseWriter, r *http.Request) {
		nonce, _ := base64.RawURLEncoding.DecodeString(r.URL.Query().Get("nonce"))
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ch, _ := iss.Issue(nonce)
		b, _ := json.Marshal(ch)
		_ = c.Write(r.Context(), websocket.MessageText, b)
		if _, _, err := c.Read(r.Context()); err == nil {
			proved = true
		}
		_ = c.Close(websocket.StatusCode(wsproof.CloseCode(uint32(connect.CodeResourceExhausted))), wsproof.PushbackReason(1500, "busy"))
	})
	mux.HandleFunc("GET /v1/challenge", func(w http.ResponseWriter, r *http.Request) {
		nonce, _ := base64.RawURLEncoding.DecodeString(r.URL.Query().Get("nonce"))
		ch, _ := iss.Issue(nonce)
		_ = json.NewEncoder(w).Encode(ch)
	})
	mux.HandleFunc("POST /v1/renew", func(w http.ResponseWriter, r *http.Request) {
		proved = true
		w.Header().Set(wsproof.PushbackHeader, "700")
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(wsproof.HTTPError{Code: "resource_exhausted", Error: "busy"})
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, &proved
}

func key(t *testing.T) (*ecdsa.PrivateKey, []byte, string) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	spki, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	pin, _ := pki.Pin(&k.PublicKey)
	return k, spki, pin
}

// TestWSGatewayProofChecked: an agent on the fallback sends its node
// proof only to a gateway that proved the pinned join-signing key; one
// that signs with another key (a proxy answering for the gateway) gets
// nothing, for a session or a renewal. A gateway's refusal arrives as
// the RPC error with its pushback.
func TestWSGatewayProofChecked(t *testing.T) {
	gk, gspki, gpin := key(t)
	ok, ospki, _ := key(t)
	nk, _, _ := key(t)
	cert := &tls.Certificate{Certificate: [][]byte{[]byte("node certificate")}, PrivateKey: nk}
	for _, tc := range []struct {
		name   string
		iss    *wsproof.Issuer
		proves bool
	}{
		{"the pinned key", wsproof.NewIssuer(gk, gspki, []byte("m"), nil), true},
		{"another key", wsproof.NewIssuer(ok, ospki, []byte("m"), nil), false},
		{"another key naming the pinned one", wsproof.NewIssuer(ok, gspki, []byte("m"), nil), false},
	} {
		srv, proved := fakeGateway(t, tc.iss)
		ca := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
			t.Fatal(err)
		}
		ws, err := NewWS(WSOptions{URL: "wss://" + srv.Listener.Addr().String() + "/v1/session", CAFile: ca, SigningPin: gpin})
		if err != nil {
			t.Fatal(err)
		}
		st, err := ws.Dial(context.Background(), func() *tls.Certificate { return cert })
		if tc.proves {
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			_, err = st.Receive()
			if connect.CodeOf(err) != connect.CodeResourceExhausted || pushback(err) != "1500" {
				t.Errorf("%s: the gateway's close: %v", tc.name, err)
			}
			st.Close()
		} else if err == nil || !strings.Contains(err.Error(), "gateway proof") {
			t.Errorf("%s: session: %v", tc.name, err)
		}
		_, err = ws.Gateway(func() *tls.Certificate { return cert }).Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: []byte("csr")}))
		if tc.proves {
			if connect.CodeOf(err) != connect.CodeResourceExhausted || pushback(err) != "700" {
				t.Errorf("%s: renewal: %v", tc.name, err)
			}
		} else if err == nil || !strings.Contains(err.Error(), "gateway proof") {
			t.Errorf("%s: renewal: %v", tc.name, err)
		}
		if *proved != tc.proves {
			t.Errorf("%s: node proof sent: %v", tc.name, *proved)
		}
	}
}

// pushback is the retry pushback an RPC error carries.
func pushback(err error) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return ""
	}
	return ce.Meta().Get("grpc-retry-pushback-ms")
}
