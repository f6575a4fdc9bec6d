package gateway_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/agent/transport"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/wsproof"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// wsClient is the WebSocket fallback's client straight to g (its serving
// CA as the CA file, as if g were the proxy).
func wsClient(t *testing.T, g *gw) *transport.WS {
	t.Helper()
	ws, err := transport.NewWS(transport.WSOptions{URL: "wss://" + strings.TrimPrefix(g.url, "https://") + "/v1/session",
		CAFile: filepath.Join(g.dir, "serving-ca.crt"), SigningPin: g.pins.JoinSigning})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ws.HTTPClient().CloseIdleConnections)
	return ws
}

// TestWebSocketNodeProof: bcgw takes a session on the fallback from a
// node that proves its key under a certificate of its node CA, and
// refuses (Unauthenticated) one whose certificate names the same node but
// another CA issued.
func TestWebSocketNodeProof(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	ws := wsClient(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	st, err := ws.Dial(ctx, func() *tls.Certificate { return certOf(a) })
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Hello{Hello: &bcdv1.Hello{NodeId: a.NodeID, Role: "node", BootId: "b"}}}); err != nil {
		t.Fatal(err)
	}
	if f, err := st.Receive(); err != nil || f.GetWelcome() == nil {
		t.Fatalf("a session on the fallback: %v %v", f, err)
	}
	st.Close()

	// The same node's identity and serial in a certificate bcgw's node CA did
	// not issue (a proxy sees both in the node's proof).
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: a.Cert.SerialNumber, Subject: pkix.Name{CommonName: a.NodeID}, URIs: a.Cert.URIs,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	forged := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	st, err = ws.Dial(ctx, func() *tls.Certificate { return forged })
	if err == nil {
		_, err = st.Receive()
		st.Close()
	}
	if connect.CodeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a forged certificate on the fallback: %v", err)
	}
}

// TestWebSocketRenewSpentOnce: a renewal over POST /v1/renew is taken
// once; the same body again (a proxy replaying it) is refused as a
// challenge answered before, and issues nothing.
func TestWebSocketRenewSpentOnce(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	hc := wsClient(t, g).HTTPClient()
	nonce := wsproof.NewNonce()
	resp, err := hc.Get(g.url + "/v1/challenge?nonce=" + base64.RawURLEncoding.EncodeToString(nonce))
	if err != nil {
		t.Fatal(err)
	}
	var ch wsproof.Challenge
	err = json.NewDecoder(resp.Body).Decode(&ch)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := wsproof.VerifyGateway(ch, nonce, g.pins.JoinSigning); err != nil {
		t.Fatal(err)
	}
	next, _ := pki.GenerateKey()
	csr, _ := pki.CreateCSR(next, "host")
	proof, _ := pki.Sign(a.Key, pki.PurposeRenew, csr)
	req, _ := proto.Marshal(&bcdv1.RenewRequest{Csr: csr, Proof: proof})
	np, err := wsproof.SignNode(a.Key, a.Cert.Raw, wsproof.PurposeRenew, ch, nonce, req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(wsproof.RenewBody{Nonce: nonce, Challenge: ch.Challenge, Proof: np, Request: req})
	post := func() (int, string) {
		resp, err := hc.Post(g.url+"/v1/renew", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, out := post(); code != http.StatusOK {
		t.Fatalf("a renewal over the fallback: %d %s", code, out)
	}
	if code, out := post(); code != http.StatusUnauthorized || !strings.Contains(out, "answered before") {
		t.Fatalf("the same renewal again: %d %s", code, out)
	}
}
