package bcx

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"connectrpc.com/connect"

	bcxv1 "github.com/better-compute/bcd/proto/gen/bcx/v1"
	"github.com/better-compute/bcd/proto/gen/bcx/v1/bcxv1connect"
)

// maxMessage bounds every Driver message either side reads.
const maxMessage = 4 << 20

// Description is what a driver says it is.
type Description struct {
	DriverID   string
	Kind       string
	Version    string
	Operations []string
}

// Request is one operation's input: config and body are JSON; secrets are
// by name and must never be logged or put in an error.
type Request struct {
	Config  json.RawMessage
	Body    json.RawMessage
	Secrets map[string][]byte
}

// Plugin is a Go driver plugin: Serve runs it.
type Plugin interface {
	Describe() Description
	// Invoke runs operation; an *Error keeps its code and retryable flag,
	// any other error is reported as code "failed".
	Invoke(ctx context.Context, operation string, req Request) (json.RawMessage, error)
}

// ErrNotFromBCD is Serve's answer when the binary was not started by bcd.
var ErrNotFromBCD = errors.New("this is a bcd driver plugin: bcd's plugin host starts it ([plugins] dir and pins)")

// Serve runs a plugin as the host expects: it checks the magic cookie,
// listens on a socket in the directory the host gave, prints the handshake
// line on stdout and serves the Driver service until SIGTERM or SIGINT, or
// until stdin closes (the host is gone).
func Serve(p Plugin) error {
	if os.Getenv(CookieKey) != CookieValue {
		return ErrNotFromBCD
	}
	hostDER, err := base64.StdEncoding.DecodeString(os.Getenv(HostCertEnv))
	if err != nil || len(hostDER) == 0 {
		return fmt.Errorf("%s: not a base64 certificate", HostCertEnv)
	}
	dir := os.Getenv(SocketDirEnv)
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%s: not an absolute directory", SocketDirEnv)
	}
	own, err := newCert("bcx plugin " + p.Describe().DriverID)
	if err != nil {
		return fmt.Errorf("plugin certificate: %w", err)
	}
	sock := filepath.Join(dir, "plugin.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen %s: %w", sock, err)
	}
	defer ln.Close()
	var protos http.Protocols
	protos.SetHTTP2(true)
	mux := http.NewServeMux()
	mux.Handle(bcxv1connect.NewDriverHandler(&driverServer{p: p}, connect.WithReadMaxBytes(maxMessage)))
	srv := &http.Server{Handler: mux, TLSConfig: serverTLS(own, hostDER), Protocols: &protos,
		ReadHeaderTimeout: 10 * time.Second, ErrorLog: nil}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		// The host holds the other end of stdin: EOF means it is gone.
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	fmt.Fprintln(os.Stdout, Handshake{Core: CoreVersion, Protocol: ProtocolVersion, Socket: sock, Cert: own.Leaf}.Line())
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	}
}

type driverServer struct{ p Plugin }

func (d *driverServer) Describe(context.Context, *connect.Request[bcxv1.DescribeRequest]) (*connect.Response[bcxv1.DescribeResponse], error) {
	x := d.p.Describe()
	return connect.NewResponse(&bcxv1.DescribeResponse{DriverId: x.DriverID, Kind: x.Kind, Version: x.Version, Operations: x.Operations}), nil
}

func (d *driverServer) Invoke(ctx context.Context, r *connect.Request[bcxv1.InvokeRequest]) (*connect.Response[bcxv1.InvokeResponse], error) {
	m := r.Msg
	defer func() {
		for _, v := range m.GetSecrets() {
			clear(v)
		}
	}()
	out, err := d.p.Invoke(ctx, m.GetOperation(), Request{Config: m.GetConfig(), Body: m.GetBody(), Secrets: m.GetSecrets()})
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{Code: "failed", Message: err.Error()}
		}
		return connect.NewResponse(&bcxv1.InvokeResponse{Error: &bcxv1.Error{Code: e.Code, Message: e.Message, Retryable: e.Retryable}}), nil
	}
	return connect.NewResponse(&bcxv1.InvokeResponse{Result: out}), nil
}

func (d *driverServer) Health(context.Context, *connect.Request[bcxv1.HealthRequest]) (*connect.Response[bcxv1.HealthResponse], error) {
	return connect.NewResponse(&bcxv1.HealthResponse{}), nil
}
