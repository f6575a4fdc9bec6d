// Command guestagent is the systemd tier's agent inside its QEMU guest
// (qemu-tests/systemd_test.go): it lets the test run commands in the guest
// and copy files in, over a virtio-serial port, without a network or a
// login. It speaks one JSON object per line each way: a request
// {"id","op":"run","cmd","timeoutMs"}, {"id","op":"put","path","mode","data"} or
// {"id","op":"fetch","url","path","mode"} (a large file from the test's
// HTTP server on the host side of the guest's network, much faster than
// the serial port under TCG) is answered by {"id","stdout","stderr","exit","error"}; when it opens
// the port it says {"hello": BOOT_ID}. It is test code: it runs as root
// whatever it is sent, on a port only the test's QEMU process holds.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

type request struct {
	ID        int    `json:"id"`
	Op        string `json:"op"`
	Cmd       string `json:"cmd,omitempty"`
	TimeoutMS int    `json:"timeoutMs,omitempty"`
	Path      string `json:"path,omitempty"`
	Mode      uint32 `json:"mode,omitempty"`
	Data      []byte `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

type response struct {
	ID     int    `json:"id"`
	Hello  string `json:"hello,omitempty"`
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	Exit   int    `json:"exit"`
	Error  string `json:"error,omitempty"`
}

func main() {
	port := "/dev/virtio-ports/bcd.agent"
	if len(os.Args) > 1 {
		port = os.Args[1]
	}
	f, err := os.OpenFile(port, os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "guestagent:", err)
		os.Exit(1)
	}
	var mu sync.Mutex
	enc := json.NewEncoder(f)
	send := func(r response) {
		mu.Lock()
		defer mu.Unlock()
		if err := enc.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, "guestagent: write:", err)
		}
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	send(response{Hello: strings.TrimSpace(string(boot))})
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		var req request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			fmt.Fprintln(os.Stderr, "guestagent: bad request:", err)
			continue
		}
		go func() { send(handle(req)) }()
	}
	fmt.Fprintln(os.Stderr, "guestagent: read:", sc.Err())
	os.Exit(1)
}

func handle(req request) response {
	r := response{ID: req.ID}
	switch req.Op {
	case "run":
		d := time.Duration(req.TimeoutMS) * time.Millisecond
		if d <= 0 {
			d = 2 * time.Minute
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", req.Cmd)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "HOME=/root", "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=", "DEBIAN_FRONTEND=noninteractive"}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		cmd.WaitDelay = 5 * time.Second
		err := cmd.Run()
		r.Stdout, r.Stderr = out.Bytes(), errOut.Bytes()
		var ee *exec.ExitError
		switch {
		case ctx.Err() != nil:
			r.Exit, r.Error = -1, fmt.Sprintf("timed out after %v", d)
		case errors.As(err, &ee):
			r.Exit = ee.ExitCode()
		case err != nil:
			r.Exit, r.Error = -1, err.Error()
		}
	case "fetch":
		resp, err := (&http.Client{Timeout: 5 * time.Minute}).Get(req.URL)
		if err != nil {
			r.Exit, r.Error = -1, err.Error()
			break
		}
		req.Data, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %s", req.URL, resp.Status)
		}
		if err != nil {
			r.Exit, r.Error = -1, err.Error()
			break
		}
		fallthrough
	case "put":
		if !filepath.IsAbs(req.Path) {
			r.Exit, r.Error = -1, "put: path must be absolute"
			break
		}
		if err := os.MkdirAll(filepath.Dir(req.Path), 0o755); err != nil {
			r.Exit, r.Error = -1, err.Error()
			break
		}
		tmp := req.Path + ".guestagent-tmp"
		if err := os.WriteFile(tmp, req.Data, os.FileMode(req.Mode)); err != nil {
			r.Exit, r.Error = -1, err.Error()
			break
		}
		if err := os.Chmod(tmp, os.FileMode(req.Mode)); err != nil {
			r.Exit, r.Error = -1, err.Error()
			break
		}
		if err := os.Rename(tmp, req.Path); err != nil {
			r.Exit, r.Error = -1, err.Error()
		}
	default:
		r.Exit, r.Error = -1, "unknown op "+req.Op
	}
	return r
}
