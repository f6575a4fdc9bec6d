package bcx

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	bcxv1 "github.com/better-compute/bcd/proto/gen/bcx/v1"
	"github.com/better-compute/bcd/proto/gen/bcx/v1/bcxv1connect"
)

// Defaults of Config.
const (
	DefaultUIDBase      = 0x7FFE0000 // the block is 0x7FFE0000 to 0x7FFEFFFF
	uidBlock            = 0x10000
	DefaultBackoffBase  = time.Second
	DefaultBackoffMax   = time.Minute
	DefaultStartTimeout = 10 * time.Second
	DefaultHealthEvery  = 10 * time.Second
	// PinsFile is the pins file's name in the plugins directory.
	PinsFile = "pins"
)

// pluginPath is the PATH a plugin gets; nothing else of bcd's environment
// reaches it.
const pluginPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Config configures a Host.
type Config struct {
	// Dir is [plugins] dir: the plugin binaries and the pins file.
	Dir string
	// UIDBase is the first uid (and gid) of the block plugins run as when
	// bcd is root: the i-th plugin in name order gets UIDBase+i.
	// 0 means DefaultUIDBase.
	UIDBase int
	// Shim is the command that starts the shim (default: this binary,
	// /proc/self/exe, with ShimName); the plugin's name is appended.
	Shim []string
	// RunDir holds each plugin run's private socket directory (default
	// os.TempDir()).
	RunDir string
	// Env is added to every plugin's environment (tests).
	Env []string
	Log *slog.Logger
	// BackoffBase and BackoffMax shape restarts: BackoffBase doubling up
	// to BackoffMax (defaults 1 s and 1 min).
	BackoffBase, BackoffMax time.Duration
	// StartTimeout bounds a start: the handshake line and Describe.
	StartTimeout time.Duration
	// HealthEvery is how often a running plugin's Health is called; a
	// failed call kills it (and it is restarted).
	HealthEvery time.Duration
}

// Host runs the pinned plugins and routes operations to their drivers.
type Host struct {
	cfg      Config
	log      *slog.Logger
	plugins  []*plugin
	byDriver map[string]*plugin
	started  sync.WaitGroup // every plugin's first start attempt
}

type plugin struct {
	pin      Pin
	uid, gid int // -1: bcd's own

	mu      sync.Mutex
	client  bcxv1connect.DriverClient // nil while down
	desc    *Description              // the last Describe, kept while down
	pid     int
	lastErr error
	starts  int
}

// New reads the pins file of c.Dir. It starts nothing; Run does.
func New(c Config) (*Host, error) {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.UIDBase == 0 {
		c.UIDBase = DefaultUIDBase
	}
	if c.UIDBase < 1 || int64(c.UIDBase)+uidBlock > 1<<32-1 {
		return nil, fmt.Errorf("plugins: uid_base %d leaves no room for a block of %d uids", c.UIDBase, uidBlock)
	}
	if len(c.Shim) == 0 {
		c.Shim = []string{"/proc/self/exe", ShimName}
	}
	if c.RunDir == "" {
		c.RunDir = os.TempDir()
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.HealthEvery <= 0 {
		c.HealthEvery = DefaultHealthEvery
	}
	if !filepath.IsAbs(c.Dir) {
		return nil, errors.New("plugins: dir must be an absolute path")
	}
	pf := filepath.Join(c.Dir, PinsFile)
	b, err := os.ReadFile(pf)
	if err != nil {
		return nil, fmt.Errorf("plugins: reading the pins file: %w", err)
	}
	pins, err := ParsePins(b)
	if err != nil {
		return nil, fmt.Errorf("plugins: %s: %w", pf, err)
	}
	if len(pins) > uidBlock {
		return nil, fmt.Errorf("plugins: more than %d plugins", uidBlock)
	}
	sort.Slice(pins, func(i, j int) bool { return pins[i].Name < pins[j].Name })
	h := &Host{cfg: c, log: c.Log.With("component", "bcx"), byDriver: map[string]*plugin{}}
	root := os.Geteuid() == 0
	for i, pin := range pins {
		p := &plugin{pin: pin, uid: -1, gid: -1}
		if root {
			p.uid, p.gid = c.UIDBase+i, c.UIDBase+i
		}
		h.plugins = append(h.plugins, p)
		h.byDriver[pin.DriverID()] = p
	}
	h.started.Add(len(h.plugins))
	return h, nil
}

// Run starts every plugin and keeps each running until ctx ends, then
// stops them all.
func (h *Host) Run(ctx context.Context) error {
	if !sandboxSupported && len(h.plugins) > 0 {
		return errors.New("plugins: bcx plugins run only on Linux")
	}
	var wg sync.WaitGroup
	for _, p := range h.plugins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.supervise(ctx, p)
		}()
	}
	wg.Wait()
	return nil
}

// WaitStarted waits, at most d, until every plugin's first start has
// succeeded or failed.
func (h *Host) WaitStarted(d time.Duration) {
	done := make(chan struct{})
	go func() { h.started.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// Drivers lists the drivers of the plugins that described themselves at
// least once, for Hello.drivers.
func (h *Host) Drivers() []*bcdv1.Driver {
	var out []*bcdv1.Driver
	for _, p := range h.plugins {
		p.mu.Lock()
		if p.desc != nil {
			out = append(out, &bcdv1.Driver{Id: p.desc.DriverID, Kind: p.desc.Kind, Version: p.desc.Version})
		}
		p.mu.Unlock()
	}
	return out
}

// Hosts reports whether a pinned plugin provides driver (running or not).
func (h *Host) Hosts(driver string) bool { return h != nil && h.byDriver[driver] != nil }

// PID is the process id of driver's running plugin, or 0 (tests).
func (h *Host) PID(driver string) int {
	p := h.byDriver[driver]
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.client == nil {
		return 0
	}
	return p.pid
}

// Invoke runs operation on driver's plugin. A driver no pinned plugin
// provides is CodeUnsupportedDriver; a plugin that is down, or goes away
// during the call, is a retryable CodeUnavailable.
func (h *Host) Invoke(ctx context.Context, driver, operation string, config, body []byte, secrets map[string][]byte) ([]byte, error) {
	var p *plugin
	if h != nil {
		p = h.byDriver[driver]
	}
	if p == nil {
		return nil, &Error{Code: CodeUnsupportedDriver, Message: fmt.Sprintf("driver %q is not hosted by this agent", driver)}
	}
	p.mu.Lock()
	client, desc, lastErr := p.client, p.desc, p.lastErr
	p.mu.Unlock()
	if client == nil {
		why := "it has not started yet"
		if lastErr != nil {
			why = lastErr.Error()
		}
		return nil, &Error{Code: CodeUnavailable, Retryable: true, Message: fmt.Sprintf("driver %s is not running (%s); bcd restarts it", driver, why)}
	}
	if !slices.Contains(desc.Operations, operation) {
		return nil, &Error{Code: CodeUnsupportedOperation, Message: fmt.Sprintf("driver %s does not implement %s", driver, operation)}
	}
	resp, err := client.Invoke(ctx, connect.NewRequest(&bcxv1.InvokeRequest{Operation: operation, Config: config, Body: body, Secrets: secrets}))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("driver %s %s: %w", driver, operation, ctx.Err())
		}
		return nil, &Error{Code: CodeUnavailable, Retryable: true, Message: fmt.Sprintf("driver %s went away during %s; bcd restarts it", driver, operation)}
	}
	if e := resp.Msg.GetError(); e != nil {
		code := e.GetCode()
		if !codeRe.MatchString(code) {
			code = "failed"
		}
		return nil, &Error{Code: code, Message: printable(e.GetMessage(), 2048), Retryable: e.GetRetryable()}
	}
	out := resp.Msg.GetResult()
	if !json.Valid(out) {
		return nil, &Error{Code: "failed", Message: fmt.Sprintf("driver %s answered %s with a result that is not JSON", driver, operation)}
	}
	return out, nil
}

var (
	codeRe = regexp.MustCompile(`^[a-z][a-z0-9-]{0,47}$`)
	opRe   = regexp.MustCompile(`^[a-z][A-Za-z0-9]{0,31}\.[a-z][A-Za-z0-9]{0,31}$`)
)

// Printable makes text from a plugin or a tool fit for a log line or an
// error: invalid UTF-8 and control characters replaced, at most n bytes
// (cut on a character boundary, "..." marking the cut).
func Printable(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") + "..."
	}
	return s
}

func printable(s string, n int) string { return Printable(s, n) }

// Delay is the wait before restart n (0-based): base doubling, capped.
func Delay(n int, base, max time.Duration) time.Duration {
	d := base
	for i := 0; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// supervise starts p, again and again, until ctx ends.
func (h *Host) supervise(ctx context.Context, p *plugin) {
	log := h.log.With("plugin", p.pin.Name)
	failures := 0
	first := true
	for {
		upFor, err := h.runOnce(ctx, p, func() {
			if first {
				first = false
				h.started.Done()
			}
		})
		if first {
			first = false
			h.started.Done()
		}
		p.mu.Lock()
		p.client, p.pid, p.lastErr = nil, 0, err
		p.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if upFor >= h.cfg.BackoffMax {
			failures = 0 // it ran long enough to count as healthy
		}
		wait := Delay(failures, h.cfg.BackoffBase, h.cfg.BackoffMax)
		failures++
		if errors.Is(err, ErrPinMismatch) {
			log.Error("plugin not started: its binary does not match its pin", "err", err, "retry_in", wait.String())
		} else {
			log.Warn("plugin exited; restarting it", "err", err, "up_for", upFor.Round(time.Millisecond).String(), "retry_in", wait.String())
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// runOnce hashes, sandboxes and starts p once and serves it until it
// exits or ctx ends; up is called once it answered Describe.
func (h *Host) runOnce(ctx context.Context, p *plugin, up func()) (time.Duration, error) {
	log := h.log.With("plugin", p.pin.Name)
	mfd, err := hashedCopy(filepath.Join(h.cfg.Dir, p.pin.Name), p.pin.Sum)
	if err != nil {
		return 0, err
	}
	defer mfd.Close()
	sockDir, err := os.MkdirTemp(h.cfg.RunDir, p.pin.Name+"-")
	if err != nil {
		return 0, fmt.Errorf("socket directory: %w", err)
	}
	defer os.RemoveAll(sockDir)
	if p.uid >= 0 {
		if err := os.Chown(sockDir, p.uid, p.gid); err != nil {
			return 0, fmt.Errorf("socket directory: %w", err)
		}
	}
	own, err := newCert("bcd plugin host")
	if err != nil {
		return 0, err
	}
	args := slices.Clone(h.cfg.Shim[1:])
	if p.uid >= 0 {
		args = append(args, "--uid", strconv.Itoa(p.uid), "--gid", strconv.Itoa(p.gid))
	}
	args = append(args, p.pin.Name)
	cmd := exec.Command(h.cfg.Shim[0], args...)
	cmd.Env = append([]string{
		CookieKey + "=" + CookieValue,
		HostCertEnv + "=" + base64.StdEncoding.EncodeToString(own.Certificate[0]),
		SocketDirEnv + "=" + sockDir,
		"PATH=" + pluginPath,
	}, h.cfg.Env...)
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{mfd}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer stdinW.Close() // the plugin sees EOF when bcd is done with it
	outR, outW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		return 0, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		outR.Close()
		outW.Close()
		return 0, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, outW, errW
	err = cmd.Start()
	stdinR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return 0, fmt.Errorf("start the shim: %w", err)
	}
	mfd.Close()
	pid := cmd.Process.Pid
	killGroup := func(sig syscall.Signal) { _ = syscall.Kill(-pid, sig) }
	exited := make(chan error, 1)
	go func() {
		defer errR.Close()
		sc := bufio.NewScanner(errR)
		sc.Buffer(make([]byte, 0, 4096), 64<<10)
		for sc.Scan() {
			log.Info("plugin stderr", "line", printable(sc.Text(), 1024))
		}
		_, _ = io.Copy(io.Discard, errR)
	}()
	go func() { exited <- cmd.Wait() }()
	// Whatever happens next, nothing of this run outlives it.
	defer killGroup(syscall.SIGKILL)

	lines := make(chan string, 1)
	go func() {
		defer outR.Close()
		br := bufio.NewReaderSize(outR, 4096)
		line, _ := readLine(br, maxHandshake)
		lines <- line
		_, _ = io.Copy(io.Discard, br) // a plugin writing to stdout never blocks
	}()
	stop := func(err error) (time.Duration, error) {
		killGroup(syscall.SIGKILL)
		<-exited
		return 0, err
	}
	timer := time.NewTimer(h.cfg.StartTimeout)
	defer timer.Stop()
	var hs Handshake
	select {
	case <-ctx.Done():
		return stop(ctx.Err())
	case err := <-exited:
		return 0, fmt.Errorf("the plugin exited before its handshake: %v", err)
	case <-timer.C:
		return stop(fmt.Errorf("no handshake within %v", h.cfg.StartTimeout))
	case line := <-lines:
		if hs, err = ParseHandshake(line, sockDir); err != nil {
			return stop(err)
		}
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", hs.Socket)
		},
		TLSClientConfig:     clientTLS(own, hs.Cert.Raw),
		ForceAttemptHTTP2:   true,
		Protocols:           &protos,
		TLSHandshakeTimeout: h.cfg.StartTimeout,
	}
	defer tr.CloseIdleConnections()
	client := bcxv1connect.NewDriverClient(&http.Client{Transport: tr}, "https://"+serverName,
		connect.WithGRPC(), connect.WithReadMaxBytes(maxMessage), connect.WithSendMaxBytes(maxMessage))
	dctx, cancel := context.WithTimeout(ctx, h.cfg.StartTimeout)
	dr, err := client.Describe(dctx, connect.NewRequest(&bcxv1.DescribeRequest{}))
	cancel()
	if err != nil {
		return stop(fmt.Errorf("Describe: %w", err))
	}
	desc, err := checkDescription(dr.Msg, p.pin.DriverID())
	if err != nil {
		return stop(err)
	}
	started := time.Now()
	p.mu.Lock()
	p.client, p.desc, p.pid, p.lastErr = client, desc, pid, nil
	p.starts++
	p.mu.Unlock()
	log.Info("plugin started", "driver", desc.DriverID, "version", desc.Version, "pid", pid, "uid", p.uid, "operations", desc.Operations)
	up()
	health := time.NewTicker(h.cfg.HealthEvery)
	defer health.Stop()
	for {
		select {
		case err := <-exited:
			if err == nil {
				err = errors.New("the plugin exited")
			}
			return time.Since(started), err
		case <-ctx.Done():
			stdinW.Close()
			killGroup(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(3 * time.Second):
				killGroup(syscall.SIGKILL)
				<-exited
			}
			log.Info("plugin stopped")
			return time.Since(started), ctx.Err()
		case <-health.C:
			hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := client.Health(hctx, connect.NewRequest(&bcxv1.HealthRequest{}))
			cancel()
			if err != nil && ctx.Err() == nil {
				log.Warn("plugin failed its health check; killing it", "err", err)
				killGroup(syscall.SIGKILL)
			}
		}
	}
}

// readLine reads one line of at most n bytes.
func readLine(br *bufio.Reader, n int) (string, error) {
	var b []byte
	for len(b) <= n {
		c, err := br.ReadByte()
		if err != nil {
			return string(b), err
		}
		if c == '\n' {
			return string(b), nil
		}
		b = append(b, c)
	}
	return "", errors.New("line too long")
}

// checkDescription checks a plugin's Describe answer.
func checkDescription(m *bcxv1.DescribeResponse, want string) (*Description, error) {
	if m.GetDriverId() != want {
		return nil, fmt.Errorf("Describe: the plugin says it is driver %q, its file name says %q", printable(m.GetDriverId(), 64), want)
	}
	if len(m.GetOperations()) == 0 || len(m.GetOperations()) > 64 {
		return nil, errors.New("Describe: a driver lists 1 to 64 operations")
	}
	for _, op := range m.GetOperations() {
		if !opRe.MatchString(op) {
			return nil, fmt.Errorf("Describe: %q is not an operation name (concern.name)", printable(op, 80))
		}
	}
	return &Description{DriverID: m.GetDriverId(), Kind: printable(m.GetKind(), 32), Version: printable(m.GetVersion(), 64),
		Operations: slices.Clone(m.GetOperations())}, nil
}
