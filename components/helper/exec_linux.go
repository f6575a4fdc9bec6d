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
