// Package helperclient is bcd node's side of privilege separation: it
// sends bcd helper one request per connection on [helper] socket and
// decodes the answer as strictly as the helper decodes the request. Files
// are named by path here and mapped to the helper's kind and id with the
// same table (components/helper/filetable); a path outside the table is
// refused before anything is sent. The tpm.* calls (tpm.go) answer the
// helper's bytes after the wire's shape checks; components/helper/helpertpm
// checks what they say.
package helperclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper/filetable"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// Timeout bounds one request (ctx may end it sooner).
const Timeout = 2 * time.Minute

// Client talks to bcd helper on Socket.
type Client struct {
	// Socket is [helper] socket.
	Socket string
}

// Error is a failed answer from the helper.
type Error struct {
	Op        string
	Msg       string
	Retryable bool // busy, or a failure that may pass when tried again
}

// Error names the operation once: many of the helper's messages already
// begin with it ("gpu.reset: ...", "file.write /path: ...").
func (e *Error) Error() string {
	if e.Op == "" || strings.HasPrefix(e.Msg, e.Op+":") || strings.HasPrefix(e.Msg, e.Op+" ") {
		return "bcd helper: " + e.Msg
	}
	return "bcd helper: " + e.Op + ": " + e.Msg
}

// IsRetryable reports whether err is a helper answer, or a connection
// failure, worth trying again.
func IsRetryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable
	}
	var c *connError
	return errors.As(err, &c)
}

// connError is a failure to reach the helper or to read its answer.
type connError struct{ err error }

func (e *connError) Error() string { return e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

// WriteFile asks the helper to write data to path, which must be a file of
// the helper's table (filetable); any other path is refused here.
func (c *Client) WriteFile(ctx context.Context, path string, data []byte) error {
	t, err := filetable.Lookup(path)
	if err != nil {
		return fmt.Errorf("writing %s through bcd helper: %w", path, err)
	}
	_, err = c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpFileWrite, Kind: t.Kind, ID: t.ID, Data: data})
	return err
}

// ApplyAccess asks the helper to apply the access section of the held
// spec: section is its body as the spec holds it (nil: none), proof the
// signed spec's proof with the trust bundle the node holds. The helper
// verifies both under its own anchors, renders and writes sshd's files
// itself, has sshd -t accept them and reloads sshd when the drop-in
// changed.
func (c *Client) ApplyAccess(ctx context.Context, section []byte, proof rootsig.Proof) error {
	p, err := json.Marshal(proof)
	if err != nil {
		return err
	}
	_, err = c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpAccessApply, Section: section, Proof: p})
	return err
}

// RemoveFile asks the helper to remove path, a file of its table; a file
// that is not there is not an error.
func (c *Client) RemoveFile(ctx context.Context, path string) error {
	t, err := filetable.Lookup(path)
	if err != nil {
		return fmt.Errorf("removing %s through bcd helper: %w", path, err)
	}
	_, err = c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpFileRemove, Kind: t.Kind, ID: t.ID})
	return err
}

// Ping asks the helper for nothing: it answers when it runs and lets this
// process in (bcd doctor's check).
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpPing})
	return err
}

// ResetGPU asks the helper to reset the GPU uuid (GPU-...), which must be
// one of the host's own; the helper checks that itself.
func (c *Client) ResetGPU(ctx context.Context, uuid string) error {
	_, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpGPUReset, GPU: uuid})
	return err
}

// Reboot asks the helper to reboot the host, saying why (cut to 200
// bytes by the helper).
func (c *Client) Reboot(ctx context.Context, reason string) error {
	_, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpReboot, Reason: reason})
	return err
}

// ReloadSSH asks the helper to reload sshd.
func (c *Client) ReloadSSH(ctx context.Context) error {
	_, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpSSHReload})
	return err
}

// ApplySlice asks the helper to confine allocation id's slice
// (bcd-alloc-<id>.slice) to cpus and mems, cpulists in the form
// wire.FormatCPUList writes, and to memoryMax bytes; "" and 0 leave one
// out (not all three).
func (c *Client) ApplySlice(ctx context.Context, id, cpus, mems string, memoryMax uint64) error {
	_, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpSliceApply, Slice: wire.SliceName(id), CPUs: cpus, Mems: mems, MemoryMax: memoryMax})
	return err
}

// RemoveSlice asks the helper to stop allocation id's slice, once it is
// empty, and remove its drop-in. A slice that still holds processes is a
// retryable *Error.
func (c *Client) RemoveSlice(ctx context.Context, id string) error {
	_, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpSliceRemove, Slice: wire.SliceName(id)})
	return err
}

// Do sends req and returns the helper's answer. A request that does not
// pass wire's Check is refused before anything is sent. A failed answer
// is returned with an *Error. Only a successful libvirt.console answer
// carries a descriptor (resp.File, the caller's to close); any other
// descriptor the answer brings is closed and the answer refused.
func (c *Client) Do(ctx context.Context, req *wire.Request) (*wire.Response, error) {
	data, err := wire.EncodeRequest(req)
	if err != nil {
		return nil, fmt.Errorf("bcd helper: %w", err)
	}
	raw, fds, err := c.roundTrip(ctx, data)
	closeFDs := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if err != nil {
		closeFDs()
		return nil, &connError{fmt.Errorf("bcd helper at %s: %s: %w", c.Socket, req.Op, err)}
	}
	resp, err := wire.DecodeResponse(raw)
	if err != nil {
		closeFDs()
		return nil, fmt.Errorf("bcd helper at %s: %s: %w", c.Socket, req.Op, err)
	}
	if !resp.OK {
		closeFDs()
		return resp, &Error{Op: req.Op, Msg: resp.Error, Retryable: resp.Retryable}
	}
	if err := resp.CheckAnswer(req.Op); err != nil {
		closeFDs()
		return nil, fmt.Errorf("bcd helper at %s: %s: %w", c.Socket, req.Op, err)
	}
	if want := btoi(resp.Console); len(fds) != want {
		closeFDs()
		return nil, fmt.Errorf("bcd helper at %s: %s: the answer carries %d descriptors, want %d", c.Socket, req.Op, len(fds), want)
	}
	if resp.Console {
		// Non-blocking, so the runtime's poller serves it and a Close
		// ends a Read in progress.
		if err := unix.SetNonblock(fds[0], true); err != nil {
			closeFDs()
			return nil, fmt.Errorf("bcd helper at %s: %s: %w", c.Socket, req.Op, err)
		}
		resp.File = os.NewFile(uintptr(fds[0]), req.Op+" "+req.ID)
	}
	return resp, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// maxFDs is the most descriptors an answer's control message is read
// with; the kernel drops the rest (MSG_CTRUNC), and the answer is then
// refused.
const maxFDs = 4

// roundTrip sends one request, half-closes the connection and reads the
// answer until the helper closes it, with the descriptors passed beside
// it (close-on-exec: Go reads with MSG_CMSG_CLOEXEC).
func (c *Client) roundTrip(ctx context.Context, data []byte) (answer []byte, fds []int, err error) {
	answer, fds, err = c.exchange(ctx, data)
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	return answer, fds, nil
}

// exchange is roundTrip's work; on an error the caller closes fds.
func (c *Client) exchange(ctx context.Context, data []byte) ([]byte, []int, error) {
	if c.Socket == "" {
		return nil, nil, errors.New("no [helper] socket configured")
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return nil, nil, err
	}
	conn := nc.(*net.UnixConn)
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	// A busy or refusing helper answers without reading: a failed write
	// is reported only when no answer follows.
	_, werr := conn.Write(data)
	if werr == nil {
		werr = conn.CloseWrite()
	}
	answer, fds, rerr := readAnswer(conn)
	if len(answer) > 0 {
		if rerr == nil {
			return answer, fds, nil // the whole answer, up to the helper's close
		}
		if _, derr := wire.DecodeResponse(answer); derr == nil {
			return answer, fds, nil // a whole answer, then a reset
		}
	}
	if errors.Is(rerr, os.ErrDeadlineExceeded) || errors.Is(werr, os.ErrDeadlineExceeded) {
		// The connection's deadline is the context's: report the context's
		// error, which the timer may set a moment after the read returned.
		<-ctx.Done()
	}
	if ctx.Err() != nil {
		return nil, fds, ctx.Err()
	}
	if rerr != nil {
		return nil, fds, fmt.Errorf("reading the answer: %w", rerr)
	}
	if werr != nil {
		return nil, fds, fmt.Errorf("sending the request: %w", werr)
	}
	return nil, fds, errors.New("the helper closed the connection without an answer")
}

// readAnswer reads up to wire.MaxResponse+1 bytes until the helper
// closes the connection, with the descriptors of every control message
// (at most maxFDs in all; more, or a truncated control message, is an
// error).
func readAnswer(conn *net.UnixConn) ([]byte, []int, error) {
	var answer []byte
	var fds []int
	buf := make([]byte, 32<<10)
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	for len(answer) <= wire.MaxResponse {
		n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
		n, oobn = max(n, 0), max(oobn, 0)
		answer = append(answer, buf[:n]...)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				if got, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, got...)
				}
			}
			if perr != nil {
				return answer, fds, fmt.Errorf("the answer's control message: %w", perr)
			}
		}
		if flags&unix.MSG_CTRUNC != 0 || len(fds) > maxFDs {
			return answer, fds, errors.New("the answer carries more descriptors than any answer does")
		}
		if errors.Is(err, io.EOF) || (n == 0 && oobn == 0 && err == nil) {
			return answer, fds, nil
		}
		if err != nil {
			return answer, fds, err
		}
	}
	return answer, fds, nil
}

// HostUnit asks the helper to plan and apply one host unit as root from
// the host section of the held spec, with its proof: the helper verifies
// the signature itself and plans the unit again from the section.
func (c *Client) HostUnit(ctx context.Context, name string, section []byte, proof rootsig.Proof) error {
	p, err := json.Marshal(proof)
	if err != nil {
		return err
	}
	_, err = c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpHostUnit, ID: name, Section: section, Proof: p})
	return err
}
