//go:build linux

package helper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// errNoTable is nft's answer for a table that is not loaded.
var errNoTable = errors.New("no such table")

// findTool looks for a root tool in the system directories only, never in
// $PATH.
func findTool(name string) (string, error) {
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// runNft runs nft with args, stdin as its input, and a clean environment.
func runNft(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	nft, err := findTool("nft")
	if err != nil {
		return nil, errNoNft
	}
	cmd := exec.CommandContext(ctx, nft, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "No such file or directory") && len(args) > 1 && args[1] == "list" {
			return nil, errNoTable
		}
		if len(msg) > 1024 {
			msg = msg[:1024] + "..."
		}
		return nil, fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

// Tools that are not installed.
var (
	errNoSystemctl = errors.New("systemctl is not installed on this host (looked in /usr/sbin, /sbin, /usr/bin and /bin)")
	errNoSMI       = errors.New("nvidia-smi is not installed on this host (looked in /usr/sbin, /sbin, /usr/bin and /bin)")
)

// toolEnv is the whole environment a tool runs with.
var toolEnv = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}

// runTool runs name, found by findTool (missing: notFound), with args and
// the fixed environment, and returns its standard output. A failure
// carries the tool's standard error, cut to 1 KiB.
func runTool(ctx context.Context, name string, notFound error, args ...string) ([]byte, error) {
	p, err := findTool(name)
	if err != nil {
		return nil, notFound
	}
	return runPath(ctx, p, name, args...)
}

// runPath runs the program at p, named name in errors, as runTool does.
func runPath(ctx context.Context, p, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, p, args...)
	cmd.Env = toolEnv
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		if len(msg) > 1024 {
			msg = msg[:1024] + "..."
		}
		return stdout.Bytes(), fmt.Errorf("%s %s = %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

// runSystemctl runs systemctl.
func runSystemctl(ctx context.Context, args ...string) ([]byte, error) {
	return runTool(ctx, "systemctl", errNoSystemctl, args...)
}

// runSMI runs nvidia-smi.
func runSMI(ctx context.Context, args ...string) ([]byte, error) {
	return runTool(ctx, "nvidia-smi", errNoSMI, args...)
}

// trimmed is a tool's output without surrounding space.
func trimmed(b []byte) string { return strings.TrimSpace(string(b)) }

// systemctlReboot asks systemd to reboot the host.
func systemctlReboot(ctx context.Context, reason string) error {
	systemctl, err := findTool("systemctl")
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, systemctl, "reboot")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("systemctl reboot: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
