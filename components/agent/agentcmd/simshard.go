package agentcmd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
)

// FilesPerMachine is what one sim machine holds open: its TLS connection
// to the gateway, its journal (the log and the lock) and its status
// socket's listener, plus one for a renewal's or a tunnel's second
// connection.
const FilesPerMachine = 5

// filesReserved is what a sim process holds besides its machines (stdio,
// the epoll fd, the config, a child's pipes, PostgreSQL-free slack).
const filesReserved = 64

// PerProcess is how many machines one bcd sim process can run under an
// open-file limit of limit: the rest go to child processes, each with its
// own limit. At least 1.
func PerProcess(limit uint64) int {
	if limit <= filesReserved+FilesPerMachine {
		return 1
	}
	return int((limit - filesReserved) / FilesPerMachine)
}

// raiseNoFile raises the soft RLIMIT_NOFILE to the hard one (the Go
// runtime does so at start on Linux; this says so where it matters and
// covers a runtime that did not) and returns the soft limit in force.
func raiseNoFile() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 1024
	}
	if l.Cur < l.Max {
		n := l
		n.Cur = n.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n) == nil {
			l = n
		}
	}
	return l.Cur
}

// parseShard reads FIRST:COUNT within nodes machines.
func parseShard(s string, nodes int) (first, count int, err error) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not FIRST:COUNT", s)
	}
	first, err1 := strconv.Atoi(a)
	count, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || first < 0 || count < 1 || first+count > nodes {
		return 0, 0, fmt.Errorf("%q is not FIRST:COUNT within --nodes %d", s, nodes)
	}
	return first, count, nil
}

// shards splits nodes machines into runs of at most per.
func shards(nodes, per int) [][2]int {
	var out [][2]int
	for first := 0; first < nodes; first += per {
		out = append(out, [2]int{first, min(per, nodes-first)})
	}
	return out
}

var rebootsRe = regexp.MustCompile(`bcd sim: \d+ machines, \d+ joined this run, (\d+) reboots`)

// runShards runs the (joined) machines of bcd sim in child processes of
// at most per machines each, the same binary with --shard: one process
// cannot hold more open files than its limit, and the hard limit may not
// be raised. Each child's stderr (its logs) goes to env.Stderr; its
// summary line is read for the reboot count. When ctx ends every child
// gets SIGTERM; a child that fails ends the others.
func runShards(ctx context.Context, env *cli.Env, config string, nodes int, seed int64, per int, log *slog.Logger) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("finding this executable to run shards: %w", err)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		mu       sync.Mutex
		reboots  int
		firstErr error
		wg       sync.WaitGroup
	)
	all := shards(nodes, per)
	log.Info("bcd sim: running machines in child processes", "machines", nodes, "processes", len(all), "per_process", per)
	for _, sh := range all {
		cmd := exec.Command(exe, "sim", "--config", config, "--nodes", strconv.Itoa(nodes), "--seed", strconv.FormatInt(seed, 10),
			"--shard", fmt.Sprintf("%d:%d", sh[0], sh[1]))
		cmd.Stderr = env.Stderr
		cmd.SysProcAttr = childAttr()
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			stop()
			wg.Wait()
			return 0, fmt.Errorf("starting shard %d:%d: %w", sh[0], sh[1], err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			go func() {
				select {
				case <-ctx.Done():
					_ = cmd.Process.Signal(syscall.SIGTERM)
				case <-done:
				}
			}()
			n := readReboots(out)
			err := cmd.Wait()
			close(done)
			mu.Lock()
			defer mu.Unlock()
			reboots += n
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("shard %d:%d: %w", sh[0], sh[1], err)
				stop()
			}
		}()
		// Started one after another: each child opens its machines'
		// journals and dials at its own pace rather than all at once.
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return reboots, firstErr
}

// readReboots reads a child's stdout to its end and returns the reboot
// count of its summary line.
func readReboots(r io.Reader) int {
	n := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if m := rebootsRe.FindStringSubmatch(sc.Text()); m != nil {
			n, _ = strconv.Atoi(m[1])
		}
	}
	return n
}

// childAttr ends a shard when bcd sim itself dies (SIGKILL included).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
