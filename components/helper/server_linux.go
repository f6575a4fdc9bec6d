//go:build linux

package helper

import (
	"context"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/selfupdate"
	"github.com/better-compute/bcd/components/trust/tpm"
)

// Limits of the server.
const (
	maxInFlight    = 32              // requests served at once; one more is answered busy
	maxWaiting     = 32              // connections being checked or told busy besides those
	requestTimeout = 2 * time.Minute // per request, reading it included
	quickTimeout   = 5 * time.Second // to tell a refused or busy caller so
)

// notAllowed is all a refused caller is told.
const notAllowed = "not allowed"

// seams are the host-facing pieces of the server, replaced by tests.
type seams struct {
	euid   int
	fakeHW bool
	// top is where the checks of directories on the way to the socket,
	// the configuration file and the entrypoint start: "/".
	top string
	// root is the file table's root: "/".
	root       string
	lookupUser func(name string) (uid, gid uint32, err error)
	// peer reads the caller's credentials; exe stats the binary it runs.
	peer func(c *net.UnixConn) (peerCred, error)
	exe  func(c *net.UnixConn, pid int32) (os.FileInfo, error)
	// self stats this helper's own binary.
	self func() (os.FileInfo, error)
	// nft runs nft with args and stdin, returning standard output.
	nft func(ctx context.Context, stdin []byte, args ...string) ([]byte, error)
	// netHost reads the named bridges and whether the host is an EC2
	// instance (netpolicy.apply).
	netHost func(bridges []string) (netpolicy.Host, error)
	// reboot reboots the host (a host build).
	reboot func(ctx context.Context, reason string) error
	// systemctl runs systemctl with args, returning standard output.
	systemctl func(ctx context.Context, args ...string) ([]byte, error)
	// smi runs nvidia-smi with args, returning standard output.
	smi func(ctx context.Context, args ...string) ([]byte, error)
	// fakeGPUs lists the GPU UUIDs of a fakehw build's machine.
	fakeGPUs func() []string
	// topology returns the host's CPUs and memory nodes as cpulists
	// (a fakehw build: its fake machine's).
	topology func() (cpus, mems string, err error)
	// gpuMinors returns the device minors of the host's NVIDIA GPUs
	// (/dev/nvidia<minor>), read at each request (a fakehw build: its
	// fake machine's).
	gpuMinors func() ([]int, error)
	// migCaps returns the nvidia-caps table (mig-minors), read at each
	// request; empty where the driver has none (a fakehw build: its fake
	// machine's).
	migCaps func() (cdispec.MIGCaps, error)
	// unitRoot is where /run/systemd/system is looked for: "/".
	unitRoot string
	// cgroup is the cgroup v2 mount: /sys/fs/cgroup.
	cgroup string
	// openTPM opens the host's TPM for the tpm.* operations, or answers
	// errNoTPM when the host has none.
	openTPM func() (*tpm.TPM, error)
	// sshAccount looks an account up for access.apply (nil: the host's
	// accounts); sshdTest replaces sshd -t (nil: the real one on
	// root/etc/ssh/sshd_config).
	sshAccount func(name string) (int, error)
	sshdTest   func(ctx context.Context) error
	// hold, when set, is called once a request holds a slot, before its
	// operation runs (tests hold requests in flight with it).
	hold func(op string)
	// listening, when set, is called once the socket is in place.
	listening func()
	// now is the helper's clock (self-update's deadlines and expiry).
	now func() time.Time
	// watchdogPoll, when set, bounds the self-update watchdog's sleep
	// (tests move now forward).
	watchdogPoll time.Duration
}

func hostSeams() seams {
	s := seams{
		euid: os.Geteuid(), fakeHW: buildinfo.FakeHW, top: "/", root: "/",
		lookupUser: lookupUser, peer: socketPeer, exe: peerExe,
		self:      func() (os.FileInfo, error) { return os.Stat("/proc/self/exe") },
		nft:       runNft,
		netHost:   func(b []string) (netpolicy.Host, error) { return netpolicy.ReadHost("/sys", b) },
		reboot:    systemctlReboot,
		systemctl: runSystemctl,
		smi:       runSMI,
		fakeGPUs:  func() []string { return nil },
		topology:  func() (string, string, error) { return hostTopology("/sys") },
		gpuMinors: func() ([]int, error) { return hostGPUMinors("/proc") },
		migCaps:   func() (cdispec.MIGCaps, error) { return hostMIGCaps("/proc") },
		unitRoot:  "/",
		cgroup:    "/sys/fs/cgroup",
		openTPM:   openHostTPM,
		now:       time.Now,
	}
	e2eSeams(&s)
	return s
}

func lookupUser(name string) (uint32, uint32, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, 0, err
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("user %s: uid %q or gid %q is not a number", name, u.Uid, u.Gid)
	}
	return uint32(uid), uint32(gid), nil
}

// server is one running helper.
type server struct {
	cfg      Config
	log      *slog.Logger
	s        seams
	uid, gid uint32      // the [helper] user and its primary group
	self     os.FileInfo // this helper's binary
	inFlight chan struct{}
	waiting  chan struct{}
	tpm      tpmKeys // the TPM and the node keys of the tpm.* operations
	// upd serves update.* (nil: self-update through the helper is off);
	// rearm wakes its watchdog after a swap.
	upd   *selfupdate.Manager
	rearm chan struct{}
}

func serve(ctx context.Context, cfg Config, log *slog.Logger, s seams) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Fake != nil {
		s.fakeGPUs, s.topology = cfg.Fake.GPUs, cfg.Fake.Topology
		s.gpuMinors, s.migCaps = cfg.Fake.minors, cfg.Fake.migCaps
	}
	srv, err := start(cfg, log, s)
	if err != nil {
		return err
	}
	l, err := srv.listen()
	if err != nil {
		return err
	}
	log.Info("helper: listening", "socket", cfg.Socket, "user", cfg.User, "uid", srv.uid, "gid", srv.gid,
		"entrypoint", cfg.Entrypoint, "fakehw", s.fakeHW)
	if s.listening != nil {
		s.listening()
	}
	return srv.run(ctx, l)
}

// start runs every check that must pass before the helper listens.
func start(cfg Config, log *slog.Logger, s seams) (*server, error) {
	if cfg.Socket == "" || cfg.User == "" {
		return nil, errors.New("[helper] socket and user are not configured")
	}
	if !filepath.IsAbs(cfg.Socket) || filepath.Clean(cfg.Socket) != cfg.Socket {
		return nil, fmt.Errorf("helper.socket: %q must be an absolute, clean path", cfg.Socket)
	}
	if s.euid != 0 && !s.fakeHW {
		return nil, fmt.Errorf("runs as root (this process runs as uid %d; only a fakehw build runs as another user)", s.euid)
	}
	uid, gid, err := s.lookupUser(cfg.User)
	if err != nil {
		return nil, fmt.Errorf("helper.user: %w", err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("helper.user: %s is root; bcd node must run as an unprivileged account", cfg.User)
	}
	srv := &server{cfg: cfg, log: log, s: s, uid: uid, gid: gid,
		inFlight: make(chan struct{}, maxInFlight), waiting: make(chan struct{}, maxWaiting)}
	if cfg.ConfigFile != "" {
		if err := srv.checkOwnedFile(cfg.ConfigFile, false, "its configuration"); err != nil {
			return nil, err
		}
	}
	if cfg.Entrypoint != "" {
		if err := srv.checkOwnedFile(cfg.Entrypoint, true, "[helper] entrypoint"); err != nil {
			return nil, err
		}
	}
	if srv.self, err = s.self(); err != nil {
		return nil, fmt.Errorf("stat of this helper's own binary: %w", err)
	}
	if err := srv.startUpdate(); err != nil {
		return nil, err
	}
	return srv, nil
}

// ownerName is who must own what the helper trusts.
func (srv *server) ownerName() string {
	if srv.s.euid == 0 {
		return "root"
	}
	return "uid " + strconv.Itoa(srv.s.euid)
}

// checkOwnedFile requires p to be a regular file the helper's owner owns
// that group and others cannot write, in directories that are the same.
// A symlink is refused unless follow (the entrypoint may be a link a
// self-update swaps); then both the link's directories and the target's
// are checked.
func (srv *server) checkOwnedFile(p string, follow bool, what string) error {
	bad := fmt.Errorf("%s must be a regular file %s owns that no one else can write (%s)", p, srv.ownerName(), what)
	if !filepath.IsAbs(p) {
		return bad
	}
	p = filepath.Clean(p)
	if err := srv.checkDirs(filepath.Dir(p), false, what+" is there"); err != nil {
		return err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return fmt.Errorf("%w: %v", bad, err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		if !follow {
			return bad
		}
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			return fmt.Errorf("%w: %v", bad, err)
		}
		if err := srv.checkDirs(filepath.Dir(target), false, what+" links there"); err != nil {
			return err
		}
		if fi, err = os.Lstat(target); err != nil {
			return fmt.Errorf("%w: %v", bad, err)
		}
	}
	if !fi.Mode().IsRegular() || !ownedBy(fi, srv.s.euid) || fi.Mode().Perm()&0o022 != 0 {
		return bad
	}
	return nil
}

// checkDirs requires every directory from s.top down to dir to be a
// directory (not a symlink) the helper's owner owns that group and others
// cannot write. With create, a missing one is created 0755.
func (srv *server) checkDirs(dir string, create bool, why string) error {
	dir = filepath.Clean(dir)
	top := filepath.Clean(srv.s.top)
	rel, err := filepath.Rel(top, dir)
	if err != nil || rel == ".." || len(rel) > 2 && rel[:3] == "../" {
		return fmt.Errorf("%s is not under %s", dir, top)
	}
	p := top
	var parts []string
	if rel != "." {
		parts = strings.Split(rel, string(filepath.Separator))
	}
	for i := -1; i < len(parts); i++ {
		if i >= 0 {
			p = filepath.Join(p, parts[i])
		}
		bad := fmt.Errorf("%s must be a directory %s owns that no one else can write (%s)", p, srv.ownerName(), why)
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) && create {
			if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("creating %s: %w", p, err)
			}
			if err := os.Chmod(p, 0o755); err != nil { // whatever the umask
				return fmt.Errorf("chmod %s 0755: %w", p, err)
			}
			fi, err = os.Lstat(p)
		}
		if err != nil {
			return fmt.Errorf("%w: %v", bad, err)
		}
		if !fi.IsDir() || !ownedBy(fi, srv.s.euid) || fi.Mode().Perm()&0o022 != 0 {
			return bad
		}
	}
	return nil
}

// listen creates the socket in a private 0700 directory beside its path,
// sets its mode (0660) and group (the [helper] user's primary group) there,
// and only then renames it into place, so root never changes a path the
// node could have swapped for a symlink.
func (srv *server) listen() (*net.UnixListener, error) {
	dir := filepath.Dir(srv.cfg.Socket)
	if err := srv.checkDirs(dir, true, "the helper socket lives there"); err != nil {
		return nil, err
	}
	priv, err := os.MkdirTemp(dir, ".bcd-helper-")
	if err != nil {
		return nil, fmt.Errorf("creating the socket's private directory: %w", err)
	}
	defer os.RemoveAll(priv)
	if err := os.Chmod(priv, 0o700); err != nil {
		return nil, fmt.Errorf("chmod %s 0700: %w", priv, err)
	}
	tmp := filepath.Join(priv, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", tmp, err)
	}
	l.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, error) {
		l.Close()
		return nil, err
	}
	if err := os.Chmod(tmp, 0o660); err != nil {
		return fail(fmt.Errorf("chmod %s 0660: %w", tmp, err))
	}
	if err := os.Chown(tmp, srv.s.euid, int(srv.gid)); err != nil {
		return fail(fmt.Errorf("chown %s %d:%d: %w", tmp, srv.s.euid, srv.gid, err))
	}
	if err := os.Rename(tmp, srv.cfg.Socket); err != nil {
		return fail(fmt.Errorf("rename %s %s: %w", tmp, srv.cfg.Socket, err))
	}
	return l, nil
}

// run accepts connections until ctx ends, then waits for the requests in
// flight and removes the socket.
func (srv *server) run(ctx context.Context, l *net.UnixListener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var placed os.FileInfo
	if fi, err := os.Lstat(srv.cfg.Socket); err == nil {
		placed = fi
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var wg sync.WaitGroup
	if srv.upd != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.watchdog(ctx)
		}()
	}
	for {
		c, aerr := l.AcceptUnix()
		if aerr != nil {
			if ctx.Err() != nil || errors.Is(aerr, net.ErrClosed) {
				break
			}
			// Out of descriptors or memory for a moment: wait, go on.
			srv.log.Warn("helper: accept failed", "error", aerr.Error())
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case srv.waiting <- struct{}{}:
		default:
			// More callers than the helper serves and answers busy: close
			// at once; the client reports a retryable failure.
			srv.log.Warn("helper: connection dropped", "reason", "too many connections")
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.conn(ctx, c)
		}()
	}
	cancel()
	wg.Wait()
	if err := srv.tpm.close(); err != nil {
		srv.log.Warn("helper: closing the TPM", "error", err.Error())
	}
	if fi, lerr := os.Lstat(srv.cfg.Socket); lerr == nil && placed != nil && os.SameFile(fi, placed) {
		os.Remove(srv.cfg.Socket)
	}
	srv.log.Info("helper: stopped")
	return nil
}

// conn serves one connection: the peer check, a slot, one request.
func (srv *server) conn(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	// When the helper stops, a caller still sending is cut off.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	waiting := true
	defer func() {
		if waiting {
			<-srv.waiting
		}
	}()
	c.SetDeadline(time.Now().Add(quickTimeout))
	p, reason := srv.checkPeer(c)
	if reason != "" {
		srv.log.Warn("helper: connection refused", "pid", p.pid, "uid", p.uid, "gid", p.gid, "reason", reason)
		answerUnread(c, wire.Failed(notAllowed, false))
		return
	}
	select {
	case srv.inFlight <- struct{}{}:
	default:
		srv.log.Warn("helper: busy", "pid", p.pid, "uid", p.uid, "in_flight", maxInFlight)
		answerUnread(c, wire.Failed(fmt.Sprintf("busy: bcd helper serves at most %d requests at once; try again", maxInFlight), true))
		return
	}
	defer func() { <-srv.inFlight }()
	<-srv.waiting
	waiting = false

	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	c.SetDeadline(time.Now().Add(requestTimeout))
	if ctx.Err() != nil {
		answer(c, wire.Failed("bcd helper is stopping; try again", true))
		return
	}
	data, err := io.ReadAll(io.LimitReader(c, wire.MaxRequest+1))
	if err != nil {
		srv.logOp(p, nil, "failed", "reading the request: "+err.Error())
		answer(c, wire.Failed("reading the request: "+err.Error(), true))
		return
	}
	resp := srv.handle(ctx, p, data)
	answer(c, resp)
}

// answer writes resp and closes the writing half. A descriptor the
// answer carries (libvirt.console) goes with its first bytes
// (SCM_RIGHTS) and is closed here: the caller holds its own copy.
func answer(c *net.UnixConn, resp *wire.Response) {
	b := wire.EncodeResponse(resp)
	if resp.File != nil {
		var n int
		if rc, err := resp.File.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) {
				n, _, _ = c.WriteMsgUnix(b, unix.UnixRights(int(fd)), nil)
			})
		}
		resp.File.Close()
		b = b[n:]
	}
	if len(b) > 0 {
		c.Write(b)
	}
	c.CloseWrite()
}

// answerUnread answers a request the helper does not read (a refused
// caller, a busy helper), then reads what the caller sent, briefly, so that
// closing with unread data does not reset the connection under the answer.
func answerUnread(c *net.UnixConn, resp *wire.Response) {
	answer(c, resp)
	c.SetReadDeadline(time.Now().Add(quickTimeout))
	io.Copy(io.Discard, io.LimitReader(c, wire.MaxRequest+1))
}

// handle decodes, checks, runs and logs one request.
func (srv *server) handle(ctx context.Context, p peerCred, data []byte) *wire.Response {
	req, err := wire.DecodeRequest(data)
	if err == nil {
		err = req.Check()
	}
	if err != nil {
		srv.logOp(p, req, "refused", err.Error())
		return wire.Failed(err.Error(), false)
	}
	if srv.s.hold != nil {
		srv.s.hold(req.Op)
	}
	resp, outcome := srv.do(context.WithValue(ctx, peerKey{}, p), req)
	if ctx.Err() != nil && !resp.OK {
		resp = wire.Failed(fmt.Sprintf("%s: did not finish within %s: %s", req.Op, requestTimeout, resp.Error), true)
		outcome = "failed"
	}
	// Every TLS handshake and node statement signs: a successful tpm.sign
	// is not logged, its refusals and failures are.
	if req.Op != wire.OpTPMSign || outcome != "ok" {
		srv.logOp(p, req, outcome, resp.Error)
	}
	return resp
}

// logOp logs one operation with the caller's pid, the operation, its kind
// and id (or GPU) and the outcome: ok, absent (a removed file was not
// there), refused or failed.
func (srv *server) logOp(p peerCred, req *wire.Request, outcome, msg string) {
	attrs := []any{"pid", p.pid, "uid", p.uid}
	if req != nil {
		// A refused request's fields are logged too, cut short.
		attrs = append(attrs, "op", short(req.Op))
		if req.Kind != "" {
			attrs = append(attrs, "kind", short(req.Kind), "id", short(req.ID))
		}
		for _, f := range []struct{ key, v string }{{"gpu", req.GPU}, {"slice", req.Slice}, {"cpus", req.CPUs}, {"mems", req.Mems}} {
			if f.v != "" {
				attrs = append(attrs, f.key, short(f.v))
			}
		}
		if req.Op == wire.OpFileWrite {
			attrs = append(attrs, "bytes", len(req.Data))
		}
		if req.Op == wire.OpHostUnit {
			attrs = append(attrs, "unit", short(req.ID))
		}
		if len(req.Unique) > 0 {
			attrs = append(attrs, "key", keyID(req.Unique))
		}
		if req.Op == wire.OpReboot {
			attrs = append(attrs, "reason", wire.CutReason(req.Reason))
		}
	}
	attrs = append(attrs, "outcome", outcome)
	if msg != "" {
		attrs = append(attrs, "error", msg)
	}
	level := slog.LevelInfo
	if outcome == "refused" || outcome == "failed" {
		level = slog.LevelWarn
	}
	srv.log.Log(context.Background(), level, "helper: operation", attrs...)
}

// short cuts a logged value a caller chose to 256 bytes.
func short(s string) string {
	if len(s) > 256 {
		return s[:256] + "..."
	}
	return s
}

// firewallRules counts the rules of bcd's three tables. loaded is false
// when bridge bcd_instances is absent; an absent inet or arp bcd_taps
// counts as no rules.
func (srv *server) firewallRules(ctx context.Context) (rules int64, loaded bool, err error) {
	loaded = true
	for _, t := range firewallTables {
		fam, name, _ := strings.Cut(t, " ")
		out, err := srv.s.nft(ctx, nil, "-j", "list", "table", fam, name)
		if errors.Is(err, errNoTable) {
			if t == firewallTables[0] {
				loaded = false
			}
			continue
		}
		if err != nil {
			return 0, false, err
		}
		n, err := countRules(out)
		if err != nil {
			return 0, false, err
		}
		rules += n
	}
	return rules, loaded, nil
}
