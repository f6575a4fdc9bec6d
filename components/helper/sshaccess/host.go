package sshaccess

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/helper/filetable"
)

// DirFiles keeps the ssh-* files under Root with plain atomic writes: bcd
// node running as root, fakehw builds and tests. bcd helper has its own
// Files, which refuses symlinks and directories others can write.
type DirFiles struct{ Root string }

func (d DirFiles) path(t filetable.Target) string { return filepath.Join(d.Root, t.Path()) }

// Read returns a file's content, refusing anything but a regular file.
func (d DirFiles) Read(t filetable.Target) ([]byte, bool, error) {
	p := d.path(t)
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if !fi.Mode().IsRegular() {
		return nil, false, fmt.Errorf("%s is not a regular file", p)
	}
	b, err := os.ReadFile(p)
	return b, err == nil, err
}

// Write replaces a file atomically, creating its directory 0755.
func (d DirFiles) Write(t filetable.Target, data []byte) error {
	p := d.path(t)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", filepath.Dir(p), err)
	}
	return atomicfile.Write(p, data, t.Mode)
}

// Remove removes a file; one that is not there is not an error.
func (d DirFiles) Remove(t filetable.Target) error {
	if err := os.Remove(d.path(t)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Principals lists the accounts with a principals file.
func (d DirFiles) Principals() ([]string, error) {
	return ListPrincipals(filepath.Join(d.Root, target("ssh-principals", "x").Dir))
}

// ListPrincipals lists the names in dir that are principals files'
// accounts (a missing dir has none).
func ListPrincipals(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if _, err := filetable.Resolve("ssh-principals", e.Name()); err == nil && e.Type().IsRegular() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// findTool looks for a tool in the system directories only, never $PATH.
func findTool(name string) (string, error) {
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed (looked in /usr/sbin, /sbin, /usr/bin and /bin; Debian's openssh-server and openssh-client)", name)
}

// Run runs a system tool with args in a fixed environment and returns its
// standard output; a failure carries its standard error, cut to 1 KiB.
func Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	p, err := findTool(name)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, p, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 1024 {
			msg = msg[:1024] + "..."
		}
		return stdout.Bytes(), fmt.Errorf("%s %s = %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

// LookupUID is a local account's uid.
func LookupUID(name string) (int, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Uid)
}

// SSHDConfig is the sshd configuration sshd -t reads under root.
func SSHDConfig(root string) string { return filepath.Join(root, "etc/ssh/sshd_config") }

// SystemHost is the Host of a machine whose file table root is root: "/"
// reloads sshd with systemctl (ssh.service, else sshd.service); any other
// root is a test's or a fakehw build's own sshd, reloaded with SIGHUP to
// the pid in root/run/sshd.pid.
func SystemHost(root string, files Files, allowSystem []string) *Host {
	h := &Host{Root: root, Files: files, Account: LookupUID, AllowSystem: allowSystem,
		KeyGen: func(ctx context.Context, args ...string) ([]byte, error) { return Run(ctx, "ssh-keygen", args...) },
		SSHDTest: func(ctx context.Context) error {
			_, err := Run(ctx, "sshd", "-t", "-f", SSHDConfig(root))
			return err
		},
	}
	if filepath.Clean(root) == "/" {
		h.Reload = ReloadSystemd
	} else {
		h.Reload = func(context.Context) error { return ReloadPidFile(filepath.Join(root, "run/sshd.pid")) }
	}
	return h
}

// ReloadSystemd reloads ssh.service (Debian, Ubuntu) or sshd.service.
func ReloadSystemd(ctx context.Context) error {
	for _, unit := range []string{"ssh.service", "sshd.service"} {
		out, err := Run(ctx, "systemctl", "show", "--property=LoadState", "--value", unit)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(out)) != "loaded" {
			continue
		}
		_, err = Run(ctx, "systemctl", "reload", unit)
		return err
	}
	return errors.New("neither ssh.service nor sshd.service is loaded on this host")
}

// ReloadPidFile sends SIGHUP to the sshd whose pid the file names; no file
// means no sshd runs there, and nothing to reload.
func ReloadPidFile(p string) error {
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return fmt.Errorf("%s does not hold a pid", p)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("SIGHUP to sshd (pid %d): %w", pid, err)
	}
	return nil
}
