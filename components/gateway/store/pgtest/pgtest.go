// Package pgtest gives tests a real PostgreSQL: a throwaway cluster made
// with initdb in a temp dir and served by postgres on a unix socket in
// that dir only (no TCP), one per test binary, with a fresh database per
// test. Run as root, the cluster belongs to and runs as the user nobody
// (postgres refuses root); the process is told to quit if the test binary
// dies. The binaries are found on PATH or in Debian's
// /usr/lib/postgresql/<version>/bin (package postgresql).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/base/testenv"
)

// ErrNoPostgres: initdb and postgres are not installed.
var ErrNoPostgres = errors.New("PostgreSQL server binaries (initdb, postgres) not found on PATH or in /usr/lib/postgresql/*/bin; install Debian's postgresql")

// User is the cluster's superuser role (trust authentication on the
// socket, which only the cluster's owner and root can reach).
const User = "bcgw"

// Cluster is a running throwaway PostgreSQL.
type Cluster struct {
	dir  string // holds data/ and the socket
	cmd  *exec.Cmd
	done chan struct{}
	// server makes the postgres process over data/ (Start, Resume).
	server func() *exec.Cmd
	mu     sync.Mutex
	n      int
}

// Binaries returns the directory holding initdb and postgres.
func Binaries() (string, error) { return binaries(os.Getenv("PATH"), "/") }

// binaries looks on path first, then in Debian's
// root/usr/lib/postgresql/<version>/bin, the highest version first.
func binaries(path, root string) (string, error) {
	for _, d := range filepath.SplitList(path) {
		if d != "" && isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "usr/lib/postgresql/*/bin"))
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

func version(bin string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return v
}

// asUser returns the credential the cluster's processes run with and
// the owner its files get: nobody when running as root, else nil (us).
func asUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("running as root, the cluster needs the user nobody: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// Start makes and starts a cluster for tests: fsync is off, since it is
// thrown away.
func Start() (*Cluster, error) { return start(false) }

// StartDurable makes and starts a cluster that syncs every commit as a
// production one does, for benchmarks.
func StartDurable() (*Cluster, error) { return start(true) }

func start(durable bool) (*Cluster, error) {
	bin, err := Binaries()
	if err != nil {
		return nil, err
	}
	cred, err := asUser()
	if err != nil {
		return nil, err
	}
	// Under the system temp dir, which every user may traverse (a test's
	// own TempDir is 0700 root).
	dir, err := os.MkdirTemp("", "bcgw-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir}
	fail := func(err error) (*Cluster, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(err)
		}
		for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
			if st, err := os.Stat(p); err != nil || st.Mode().Perm()&0o001 == 0 {
				return fail(fmt.Errorf("the cluster runs as nobody, who cannot reach %s (%s is not searchable by others); set TMPDIR to a directory it can reach, such as /tmp", dir, p))
			}
			if p == filepath.Dir(p) {
				break
			}
		}
	}
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = dir
		cmd.Env = []string{"LC_ALL=C", "PATH=/usr/bin:/bin", "HOME=" + dir}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
		return cmd
	}
	data := filepath.Join(dir, "data")
	if out, err := run("initdb", "-D", data, "-U", User, "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w\n%s", err, out))
	}
	args := []string{"-D", data, "-k", dir, "-c", "listen_addresses=", "-c", "max_connections=200"}
	if !durable {
		// A test cluster is thrown away, and a store reopened by a test
		// reads through the same running server.
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	c.server = func() *exec.Cmd { return run("postgres", args...) }
	if err := c.serve(); err != nil {
		return fail(err)
	}
	return c, nil
}

// serve starts postgres over the cluster's data and waits until it
// accepts connections.
func (c *Cluster) serve() error {
	log, err := os.OpenFile(filepath.Join(c.dir, "postgres.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	c.cmd = c.server()
	c.cmd.Stdout, c.cmd.Stderr = log, log
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	done := make(chan struct{})
	c.done = done
	go func() { c.cmd.Wait(); close(done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
			return fmt.Errorf("postgres exited: %s", b)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.halt()
			return fmt.Errorf("postgres did not accept connections within 60s: %w", err)
		}
	}
}

// Dir is the cluster's directory (its socket is there).
func (c *Cluster) Dir() string { return c.dir }

// URL is the connection URL of database db over the cluster's socket.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://%s@/%s?host=%s&sslmode=disable", User, db, c.dir)
}

// NewDatabase creates an empty database and returns its URL.
func (c *Cluster) NewDatabase(ctx context.Context) (string, error) {
	c.mu.Lock()
	c.n++
	name := fmt.Sprintf("t%d", c.n)
	c.mu.Unlock()
	if err := c.CreateDatabase(ctx, name); err != nil {
		return "", err
	}
	return c.URL(name), nil
}

// CreateDatabase creates the database name (a plain identifier).
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// Stop shuts the server down (fast shutdown, then kill) and removes the
// cluster.
func (c *Cluster) Stop() {
	c.halt()
	os.RemoveAll(c.dir)
}

// halt shuts the server down (fast shutdown, then kill), keeping its data.
func (c *Cluster) halt() {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-c.done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.done
		}
	}
}

// Pause stops the server as an operator's restart does (fast shutdown:
// open connections are ended), keeping the cluster for Resume.
func (c *Cluster) Pause() { c.halt() }

// Resume starts the server again over the same data after Pause and
// waits until it accepts connections.
func (c *Cluster) Resume() error { return c.serve() }

var (
	shared    *Cluster
	sharedErr error
	once      sync.Once
)

// StartT starts a cluster of the test's own (one it may stop or whose
// socket it may proxy), stopped when the test ends. Without PostgreSQL
// the test is skipped (a failure under CI).
func StartT(t testing.TB) *Cluster {
	t.Helper()
	c, err := Start()
	if errors.Is(err, ErrNoPostgres) {
		testenv.Skip(t, "%v", err)
	}
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// Database returns the URL of a fresh database on the test binary's one
// cluster, started on first use. Without PostgreSQL the test is skipped
// (a failure under CI).
func Database(t testing.TB) string {
	t.Helper()
	once.Do(func() { shared, sharedErr = Start() })
	if errors.Is(sharedErr, ErrNoPostgres) {
		testenv.Skip(t, "%v", sharedErr)
	}
	if sharedErr != nil {
		t.Fatalf("start PostgreSQL: %v", sharedErr)
	}
	url, err := shared.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return url
}

// Main runs a test binary's tests and then stops the shared cluster, if
// one was started; call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	os.Exit(code)
}
