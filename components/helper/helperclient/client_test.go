package helperclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper/filetable"
	"github.com/better-compute/bcd/components/helper/wire"
)

// fakeHelper answers every connection with answer(request).
type fakeHelper struct {
	socket   string
	accepted atomic.Int32
	requests chan []byte
}

func newFake(t *testing.T, readFirst bool, answer func(req []byte) []byte) *fakeHelper {
	t.Helper()
	f := &fakeHelper{socket: filepath.Join(t.TempDir(), "helper.sock"), requests: make(chan []byte, 16)}
	l, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			f.accepted.Add(1)
			go func() {
				defer c.Close()
				var req []byte
				if readFirst {
					req, _ = io.ReadAll(c)
					f.requests <- req
				}
				if a := answer(req); a != nil {
					c.Write(a)
				}
			}()
		}
	}()
	return f
}

func TestWriteAndRemoveSendKindAndID(t *testing.T) {
	f := newFake(t, true, func([]byte) []byte { return []byte(`{"v":1,"ok":true}`) })
	c := &Client{Socket: f.socket}
	ctx := context.Background()
	if err := c.WriteFile(ctx, "/etc/cdi/bcd-gpu0.json", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if got := string(<-f.requests); got != `{"v":1,"op":"file.write","kind":"cdi","id":"gpu0","data":"e30="}` {
		t.Errorf("sent %s", got)
	}
	if err := c.RemoveFile(ctx, "/var/lib/bcd-hostconfig/k8s/bootstrap-token"); err != nil {
		t.Fatal(err)
	}
	if got := string(<-f.requests); got != `{"v":1,"op":"file.remove","kind":"k8s-token"}` {
		t.Errorf("sent %s", got)
	}
}

// TestRefusedBeforeSending: a path outside the table, or a request that
// does not pass Check, never reaches the socket.
func TestRefusedBeforeSending(t *testing.T) {
	f := newFake(t, true, func([]byte) []byte { return []byte(`{"v":1,"ok":true}`) })
	c := &Client{Socket: f.socket}
	ctx := context.Background()
	for _, p := range []string{"/etc/passwd", "/etc/cdi/../passwd", "etc/cdi/bcd-x.json", "/etc/cdi/bcd-a.b.json", "/etc/ssh/bc_principals/.."} {
		if err := c.WriteFile(ctx, p, []byte("x")); !errors.Is(err, filetable.ErrNotInTable) {
			t.Errorf("WriteFile(%q) = %v, want ErrNotInTable", p, err)
		}
		if err := c.RemoveFile(ctx, p); !errors.Is(err, filetable.ErrNotInTable) {
			t.Errorf("RemoveFile(%q) = %v, want ErrNotInTable", p, err)
		}
	}
	if err := c.WriteFile(ctx, "/etc/cdi/bcd-x.json", make([]byte, filetable.MaxFileSize+1)); err == nil {
		t.Error("a file over 1 MiB was sent")
	}
	for _, r := range []wire.Request{
		{V: 1, Op: "file.chmod"},
		{V: 2, Op: wire.OpSSHReload},
		{V: 1, Op: wire.OpFileRemove, Kind: "cdi", ID: "x", Data: []byte("x")},
		{V: 1, Op: "firewall.apply"},
		{V: 1, Op: wire.OpAccessApply, Section: []byte(`{}`)},
	} {
		if _, err := c.Do(ctx, &r); err == nil {
			t.Errorf("Do(%+v) succeeded", r)
		}
	}
	if n := f.accepted.Load(); n != 0 {
		t.Errorf("%d connections, want none", n)
	}
}

// TestAnswersDecodedStrictly: anything but one well-formed version 1
// answer is an error.
func TestAnswersDecodedStrictly(t *testing.T) {
	tests := []struct {
		name, answer, wantErr string
	}{
		{"unknown field", `{"v":1,"ok":true,"path":"/x"}`, `unknown field "path"`},
		{"other version", `{"v":2,"ok":true}`, "protocol version 2"},
		{"two answers", `{"v":1,"ok":true}{"v":1,"ok":true}`, "more than one JSON value"},
		{"no answer", ``, "closed the connection without an answer"},
		{"not JSON", `ok`, "not JSON"},
		{"failed without retryable", `{"v":1,"ok":false,"error":"x"}`, "failed without an error and retryable"},
		{"too large", `{"v":1,"ok":true,"x":"` + strings.Repeat("x", wire.MaxResponse) + `"}`, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, true, func([]byte) []byte { return []byte(tt.answer) })
			c := &Client{Socket: f.socket}
			_, err := c.Do(context.Background(), &wire.Request{V: 1, Op: wire.OpSSHReload})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestFailedAnswer(t *testing.T) {
	f := newFake(t, true, func([]byte) []byte { return []byte(`{"v":1,"ok":false,"error":"not allowed","retryable":false}`) })
	c := &Client{Socket: f.socket}
	resp, err := c.Do(context.Background(), &wire.Request{V: 1, Op: wire.OpSSHReload})
	var herr *Error
	if !errors.As(err, &herr) || herr.Msg != "not allowed" || herr.Retryable || IsRetryable(err) {
		t.Fatalf("err = %v", err)
	}
	if resp == nil || resp.OK || resp.Error != "not allowed" {
		t.Errorf("resp = %+v", resp)
	}
	if err.Error() != "bcd helper: ssh.reload: not allowed" {
		t.Errorf("message %q", err)
	}
}

// TestBusyWithoutReading: a helper that answers busy without reading a
// large request still gets its answer through.
func TestBusyWithoutReading(t *testing.T) {
	f := newFake(t, false, func([]byte) []byte {
		return []byte(`{"v":1,"ok":false,"error":"busy","retryable":true}`)
	})
	c := &Client{Socket: f.socket}
	err := c.WriteFile(context.Background(), "/etc/cdi/bcd-x.json", bytes.Repeat([]byte("x"), filetable.MaxFileSize))
	var herr *Error
	if !errors.As(err, &herr) || !herr.Retryable || herr.Msg != "busy" || !IsRetryable(err) {
		t.Fatalf("err = %v, want busy", err)
	}
}

func TestContextEnds(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	f := newFake(t, true, func([]byte) []byte { <-stop; return nil })
	c := &Client{Socket: f.socket}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Do(ctx, &wire.Request{V: 1, Op: wire.OpSSHReload})
	if !errors.Is(err, context.DeadlineExceeded) || !IsRetryable(err) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
}

func TestNoSocket(t *testing.T) {
	c := &Client{Socket: filepath.Join(t.TempDir(), "absent.sock")}
	if _, err := c.Do(context.Background(), &wire.Request{V: 1, Op: wire.OpSSHReload}); err == nil || !IsRetryable(err) {
		t.Fatalf("err = %v, want a retryable connection failure", err)
	}
	if _, err := (&Client{}).Do(context.Background(), &wire.Request{V: 1, Op: wire.OpSSHReload}); err == nil {
		t.Fatal("no socket: succeeded")
	}
}

// TestOperationsSend: each call sends its operation with exactly its
// fields, and one that does not pass Check (a slice id systemd would read
// as a path or as two levels, cpulists out of form, a GPU that is not a
// UUID) never reaches the socket.
func TestOperationsSend(t *testing.T) {
	f := newFake(t, true, func([]byte) []byte { return []byte(`{"v":1,"ok":true}`) })
	c := &Client{Socket: f.socket}
	ctx := context.Background()
	const gpu = "GPU-5f1c0a2e-1111-4222-8333-944455556666"
	tests := []struct {
		name string
		call func() error
		sent string
	}{
		{"ping", func() error { return c.Ping(ctx) }, `{"v":1,"op":"ping"}`},
		{"gpu.reset", func() error { return c.ResetGPU(ctx, gpu) }, `{"v":1,"op":"gpu.reset","gpu":"` + gpu + `"}`},
		{"ssh.reload", func() error { return c.ReloadSSH(ctx) }, `{"v":1,"op":"ssh.reload"}`},
		{"slice.apply", func() error { return c.ApplySlice(ctx, "alloc_01", "0-3,8", "0", 0) },
			`{"v":1,"op":"slice.apply","slice":"bcd-alloc-alloc_01.slice","cpus":"0-3,8","mems":"0"}`},
		{"slice.apply cpus only", func() error { return c.ApplySlice(ctx, "a1", "2", "", 0) },
			`{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"2"}`},
		{"slice.remove", func() error { return c.RemoveSlice(ctx, "a1") }, `{"v":1,"op":"slice.remove","slice":"bcd-alloc-a1.slice"}`},
	}
	for _, tt := range tests {
		if err := tt.call(); err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if got := string(<-f.requests); got != tt.sent {
			t.Errorf("%s sent %s, want %s", tt.name, got, tt.sent)
		}
	}
	before := f.accepted.Load()
	for name, call := range map[string]func() error{
		"gpu by index":       func() error { return c.ResetGPU(ctx, "0") },
		"slice id with /":    func() error { return c.ApplySlice(ctx, "../x", "0", "", 0) },
		"slice id with --":   func() error { return c.RemoveSlice(ctx, "a--b") },
		"no limit at all":    func() error { return c.ApplySlice(ctx, "a1", "", "", 0) },
		"cpus not canonical": func() error { return c.ApplySlice(ctx, "a1", "1,2", "", 0) },
		"mems with a space":  func() error { return c.ApplySlice(ctx, "a1", "0", "0, 1", 0) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: sent", name)
		}
	}
	if n := f.accepted.Load(); n != before {
		t.Errorf("%d refused calls reached the socket", n-before)
	}
}

func TestTPMCallsSend(t *testing.T) {
	// Each answer carries the one result its operation answers.
	answers := map[string]string{
		wire.OpTPMNodeKey: `{"v":1,"ok":true,"public":"AQI="}`,
		wire.OpTPMSign:    `{"v":1,"ok":true,"signature":"AwQ="}`,
		wire.OpTPMAK:      `{"v":1,"ok":true,"ak_public":"BQY="}`,
		wire.OpTPMCertify: `{"v":1,"ok":true,"attest":"Bw==","signature":"CA==","ak_public":"CQ=="}`,
		wire.OpTPMRelease: `{"v":1,"ok":true}`,
	}
	f := newFake(t, true, func(req []byte) []byte {
		r, err := wire.DecodeRequest(req)
		if err != nil {
			return []byte(`{"v":1,"ok":false,"error":"bad","retryable":false}`)
		}
		return []byte(answers[r.Op])
	})
	c := &Client{Socket: f.socket}
	ctx := context.Background()
	u := bytes.Repeat([]byte{1}, 32)
	const ub = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="
	got := func(b ...[]byte) string { return string(bytes.Join(b, []byte(","))) }
	tests := []struct {
		name, sent, want string
		call             func() (string, error)
	}{
		{"tpm.nodekey", `{"v":1,"op":"tpm.nodekey","unique":"` + ub + `"}`, "\x01\x02",
			func() (string, error) { p, err := c.TPMNodeKey(ctx, u); return got(p), err }},
		{"tpm.sign", `{"v":1,"op":"tpm.sign","unique":"` + ub + `","digest":"` + ub + `"}`, "\x03\x04",
			func() (string, error) { s, err := c.TPMSign(ctx, u, u); return got(s), err }},
		{"tpm.ak", `{"v":1,"op":"tpm.ak"}`, "\x05\x06",
			func() (string, error) { p, err := c.TPMAK(ctx); return got(p), err }},
		{"tpm.certify", `{"v":1,"op":"tpm.certify","unique":"` + ub + `","qualifying_data":"` + ub + `"}`, "\x07,\x08,\x09",
			func() (string, error) { a, s, p, err := c.TPMCertify(ctx, u, u); return got(a, s, p), err }},
		{"tpm.release", `{"v":1,"op":"tpm.release","unique":"` + ub + `"}`, "",
			func() (string, error) { return "", c.TPMRelease(ctx, u) }},
	}
	for _, tt := range tests {
		res, err := tt.call()
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if res != tt.want {
			t.Errorf("%s answered %q, want %q", tt.name, res, tt.want)
		}
		if s := string(<-f.requests); s != tt.sent {
			t.Errorf("%s sent %s, want %s", tt.name, s, tt.sent)
		}
	}
	before := f.accepted.Load()
	for name, call := range map[string]func() error{
		"short unique":           func() error { _, err := c.TPMNodeKey(ctx, u[:31]); return err },
		"20-byte digest":         func() error { _, err := c.TPMSign(ctx, u, u[:20]); return err },
		"64-byte qualifying":     func() error { _, _, _, err := c.TPMCertify(ctx, u, append(u, u...)); return err },
		"release without unique": func() error { return c.TPMRelease(ctx, nil) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: sent", name)
		}
	}
	if n := f.accepted.Load(); n != before {
		t.Errorf("%d refused calls reached the socket", n-before)
	}
}

func TestTPMAnswersOfAnotherShape(t *testing.T) {
	for op, answer := range map[string]string{
		"sign answering nothing":       `{"v":1,"ok":true}`,
		"sign answering a public area": `{"v":1,"ok":true,"signature":"AQ==","public":"AQ=="}`,
	} {
		f := newFake(t, true, func([]byte) []byte { return []byte(answer) })
		c := &Client{Socket: f.socket}
		if _, err := c.TPMSign(context.Background(), make([]byte, 32), make([]byte, 32)); err == nil {
			t.Errorf("%s: accepted", op)
		}
	}
	notLoaded := &Error{Op: wire.OpTPMSign, Msg: "tpm.sign: " + wire.NotLoaded}
	if !IsNotLoaded(notLoaded) || IsNotLoaded(&Error{Op: wire.OpTPMSign, Msg: "busy"}) || IsNotLoaded(errors.New(wire.NotLoaded)) {
		t.Error("IsNotLoaded")
	}
	if !IsNoTPM(&Error{Op: wire.OpTPMAK, Msg: wire.NoTPM}) || IsNoTPM(notLoaded) {
		t.Error("IsNoTPM")
	}
}

// TestErrorNamesTheOperationOnce: a helper message that already begins
// with its operation is not prefixed with it again.
func TestErrorNamesTheOperationOnce(t *testing.T) {
	for _, tt := range []struct {
		op, msg, want string
	}{
		{"ssh.reload", "not allowed", "bcd helper: ssh.reload: not allowed"},
		{"gpu.reset", "gpu.reset: GPU-1 is not a GPU of this host", "bcd helper: gpu.reset: GPU-1 is not a GPU of this host"},
		{"file.write", "file.write /etc/x: refused", "bcd helper: file.write /etc/x: refused"},
		{"gpu.reset", "gpu.resetx: odd", "bcd helper: gpu.reset: gpu.resetx: odd"},
	} {
		if got := (&Error{Op: tt.op, Msg: tt.msg}).Error(); got != tt.want {
			t.Errorf("Error{%q, %q} = %q, want %q", tt.op, tt.msg, got, tt.want)
		}
	}
}

// TestDescriptorsOnlyWithAConsole: an answer that brings a descriptor
// where its operation answers none (ping), or a console answer without
// one, is refused, and the descriptor the client received is closed.
func TestDescriptorsOnlyWithAConsole(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "helper.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var answer atomic.Value
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			io.ReadAll(c)
			rights := unix.UnixRights(int(w.Fd()))
			if answer.Load().(string) == `{"v":1,"ok":true,"console":true}` {
				rights = nil
			}
			c.WriteMsgUnix([]byte(answer.Load().(string)), rights, nil)
			c.Close()
		}
	}()
	c := &Client{Socket: socket}
	answer.Store(`{"v":1,"ok":true}`)
	if _, err := c.Do(context.Background(), &wire.Request{V: wire.Version, Op: wire.OpPing}); err == nil || !strings.Contains(err.Error(), "carries 1 descriptors, want 0") {
		t.Fatalf("ping answered with a descriptor: %v", err)
	}
	answer.Store(`{"v":1,"ok":true,"console":true}`)
	if _, err := c.Do(context.Background(), &wire.Request{V: wire.Version, Op: wire.OpLibvirtConsole, ID: "vm-a"}); err == nil || !strings.Contains(err.Error(), "carries 0 descriptors, want 1") {
		t.Fatalf("a console answer without one: %v", err)
	}
	// Every copy of the pipe's write end is closed (the server's and the
	// one the client received and dropped): its read end sees the end.
	w.Close()
	r.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := r.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the pipe's read end: %d, %v; a received descriptor is still open", n, err)
	}
}
