package status

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Protocol limits.
const (
	// Request is the one request the socket answers.
	Request = "status"
	// ConnTimeout bounds each connection: reading the request, writing the
	// answer.
	ConnTimeout = 5 * time.Second
	// MaxRequest is the most the server reads of a request.
	MaxRequest = 1 << 10
	// MaxResponse is the most Read accepts of an answer.
	MaxResponse = 16 << 20
	// maxConns bounds the connections served at once; more wait in the
	// kernel's backlog until one finishes or times out.
	maxConns = 32
)

// errorReply is the answer to a request the server does not know.
type errorReply struct {
	Error string `json:"error"`
}

// Serve serves snap's Snapshot on a unix socket at path until ctx ends,
// then removes the socket and returns nil.
//
// The socket's directory is created 0700 when missing; an existing one
// must belong to this user and be closed to group and others, or Serve
// refuses it. A stale socket left by a dead agent is replaced; a socket
// another process still answers on is not. The socket is 0600. Each
// connection sends "status\n" and gets one line of JSON within
// ConnTimeout. snap is called once per request, from many goroutines at
// once. log may be nil.
func Serve(ctx context.Context, path string, snap func() Snapshot, log *slog.Logger) error {
	return serve(ctx, path, snap, log, ConnTimeout)
}

func serve(ctx context.Context, path string, snap func() Snapshot, log *slog.Logger, timeout time.Duration) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "status", "socket", path)
	l, err := listen(path)
	if err != nil {
		return err
	}
	// Closing the listener unlinks the socket.
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	log.Info("serving status")

	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, maxConns)
	for {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			l.Close()
			return nil
		}
		c, err := l.Accept()
		if err != nil {
			<-sem
			if ctx.Err() != nil {
				l.Close()
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept on %s: %w", path, err)
			}
			// A transient failure (out of file descriptors): wait a
			// little rather than spin.
			log.Warn("accept failed", "err", err)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			handle(ctx, c, snap, log, timeout)
		}()
	}
}

// listen checks or makes the socket's directory, clears a stale socket and
// listens with mode 0600.
func listen(path string) (*net.UnixListener, error) {
	if path == "" {
		return nil, errors.New("status socket: no path (socket_path)")
	}
	if err := checkDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	if err := clearStale(path); err != nil {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on unix socket %s: %w", path, err)
	}
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod 0600 %s: %w", path, err)
	}
	return l, nil
}

// checkDir creates dir 0700 when it is missing, and otherwise requires a
// directory of this user's that group and others cannot enter.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create status socket directory %s: %w", dir, err)
		}
		// MkdirAll's mode passes through the umask; say it exactly.
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("chmod 0700 %s: %w", dir, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("status socket directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("status socket directory %s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("status socket directory %s is open to group or others (mode %04o); the socket must be root's alone: chmod 0700 %s, or set socket_path to a file in a private directory", dir, perm, dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("status socket directory %s belongs to uid %d, not to this process (uid %d): chown it or set socket_path to a directory of bcd's", dir, st.Uid, os.Geteuid())
	}
	return nil
}

// clearStale removes a socket at path that nothing answers on. It refuses
// a file that is not a socket and a socket that is still served.
func clearStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("status socket: %w", err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("status socket %s exists and is not a socket: remove it or set another socket_path", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("status socket %s is served by another process: is another bcd agent running?", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale status socket: %w", err)
	}
	return nil
}

// handle answers one connection: one request line, one JSON line.
func handle(ctx context.Context, c net.Conn, snap func() Snapshot, log *slog.Logger, timeout time.Duration) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return
	}
	req, err := readRequest(c)
	if err != nil {
		log.Debug("status request dropped", "err", err)
		return
	}
	var reply any
	if req == Request {
		s := snap()
		s.normalize()
		reply = s
	} else {
		// The request is not echoed: it is whatever a client sent.
		reply = errorReply{Error: "unknown request; send \"status\""}
	}
	b, err := json.Marshal(reply)
	if err != nil {
		log.Error("encoding the status snapshot failed", "err", err)
		b, _ = json.Marshal(errorReply{Error: "the agent could not encode its status"})
	}
	if _, err := c.Write(append(b, '\n')); err != nil {
		log.Debug("status reply not delivered", "err", err)
	}
}

// readRequest reads one line of at most MaxRequest bytes, ended by a
// newline or by the client closing its side.
func readRequest(r io.Reader) (string, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, MaxRequest), MaxRequest)
	line, err := br.ReadSlice('\n')
	switch {
	case err == nil, errors.Is(err, io.EOF) && len(line) > 0:
		return string(bytes.TrimRight(line, "\r\n")), nil
	case errors.Is(err, bufio.ErrBufferFull):
		return "", fmt.Errorf("request longer than %d bytes", MaxRequest)
	case errors.Is(err, io.EOF):
		return "", errors.New("no request")
	default:
		return "", fmt.Errorf("read request: %w", err)
	}
}

// Read asks the agent serving the socket at path for its Snapshot. It
// gives up after ConnTimeout unless ctx ends sooner. Its errors say what to
// check.
func Read(ctx context.Context, path string) (Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, ConnTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Snapshot{}, dialError(path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := io.WriteString(c, Request+"\n"); err != nil {
		return Snapshot{}, fmt.Errorf("send the status request on %s: %w", path, err)
	}
	br := bufio.NewReader(io.LimitReader(c, MaxResponse+1))
	line, err := br.ReadBytes('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		if len(line) > MaxResponse {
			return Snapshot{}, fmt.Errorf("read status from %s: answer larger than %d bytes", path, MaxResponse)
		}
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return Snapshot{}, fmt.Errorf("read status from %s: no answer in time: is bcd node stuck? (socket_path = %s)", path, path)
		}
		return Snapshot{}, fmt.Errorf("read status from %s: %w (is bcd node running? socket_path = %s)", path, err, path)
	}
	var e errorReply
	if err := json.Unmarshal(line, &e); err != nil {
		return Snapshot{}, fmt.Errorf("decode status from %s: %w", path, err)
	}
	if e.Error != "" {
		return Snapshot{}, fmt.Errorf("the agent on %s refused the request: %s", path, e.Error)
	}
	var s Snapshot
	if err := json.Unmarshal(line, &s); err != nil {
		return Snapshot{}, fmt.Errorf("decode status from %s: %w", path, err)
	}
	return s, nil
}

// dialError says what a failed connection to the socket most likely means.
func dialError(path string, err error) error {
	hint := "is bcd node running? socket_path = " + path
	switch {
	case errors.Is(err, fs.ErrNotExist):
		hint = "no socket there: is bcd node running? socket_path = " + path
	case errors.Is(err, syscall.ECONNREFUSED):
		hint = "nothing answers: is bcd node running? socket_path = " + path
	case errors.Is(err, fs.ErrPermission):
		hint = "the socket is the agent's alone: run bcd status as root or as the user bcd node runs as"
	}
	return fmt.Errorf("connect to the status socket %s: %w (%s)", path, err, hint)
}
