// Package transport dials the gateway: an HTTP/2-only client over TLS 1.3
// pinned to the serving CA (never system roots), with HTTP/2 pings every
// 20 s, and the connect-go AgentGateway client on top.
package transport

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// MaxFrame bounds every message the agent reads: a desired state of 4 MiB
// plus its envelope.
const MaxFrame = 5 << 20

// PingEvery is how often an idle HTTP/2 connection is pinged.
const PingEvery = 20 * time.Second

// Options says how to reach the gateway.
type Options struct {
	URL              string
	ServerName       string
	ServingCASPKIPin string
	// ClientCert, when set, is offered for mTLS on every handshake.
	ClientCert func() (*tls.Certificate, error)
}

// HTTPClient returns an HTTP/2-only client pinned to the serving CA.
func HTTPClient(o Options) (*http.Client, error) {
	name := o.ServerName
	if name == "" {
		// Without gateway_server_name the URL's host is the name to verify.
		u, err := url.Parse(o.URL)
		if err != nil || u.Hostname() == "" {
			return nil, fmt.Errorf("gateway URL %q has no host", o.URL)
		}
		name = u.Hostname()
	}
	tc, err := pki.ClientTLS(o.ServingCASPKIPin, name, nil)
	if err != nil {
		return nil, err
	}
	if o.ClientCert != nil {
		get := o.ClientCert
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return get() }
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{
		TLSClientConfig:     tc,
		ForceAttemptHTTP2:   true,
		Protocols:           &protos,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout: PingEvery,
			PingTimeout:     15 * time.Second,
		},
	}
	return &http.Client{Transport: tr}, nil
}

// Client returns the AgentGateway client over the gRPC protocol.
func Client(o Options) (bcdv1connect.AgentGatewayClient, *http.Client, error) {
	hc, err := HTTPClient(o)
	if err != nil {
		return nil, nil, err
	}
	return bcdv1connect.NewAgentGatewayClient(hc, o.URL, connect.WithGRPC(), connect.WithReadMaxBytes(MaxFrame)), hc, nil
}
