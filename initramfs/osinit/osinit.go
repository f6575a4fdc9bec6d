// Package osinit is the init of the test "installed OS" that deploy.image
// writes in the QEMU tests (images/osimage): the same flow as the ramdisk's
// (initramfs/rdinit: modules, DHCP), then it mounts the OS's root
// partition (bcos.root= on the kernel command line, /dev/vda1 by default),
// binds its /etc/bcd and /var/lib/bcd where bcd looks for them, and runs
// `bcd join --node-id <etc/bcd/node-id> --token-file etc/bcd/join-token`
// (the provisioned attestor; exits 0 when already joined), or
// `bcd join --attestor tpm` when etc/bcd/attestor says "tpm", and then
// `bcd node`. A real OS does the same with the units of build/systemd.
package osinit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Prefix starts every line the init prints.
const Prefix = "bcd-os: "

// DefaultRoot is the root partition when the command line names none.
const DefaultRoot = "/dev/vda1"

// RootDevice returns bcos.root= from a kernel command line.
func RootDevice(cmdline string) string {
	for _, w := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(w, "bcos.root="); ok && strings.HasPrefix(v, "/dev/") {
			return v
		}
	}
	return DefaultRoot
}

// AttestorFile, under etc, names the attestor the OS joins with when it is
// not the provisioned one: one word, and only "tpm" is known (the host's
// TPM, no token).
const AttestorFile = "attestor"

// Steps are the bcd commands to run with the OS's files under etc (the
// bound /etc/bcd): join as the node the deploy named, then run the node.
// Without a node-id file the OS has no provisioned identity to take, and
// joins only if it already has (bcd join exits 0 then). An attestor file
// saying "tpm" makes the join `bcd join --attestor tpm` (no token, no node
// id: the gateway names the node); it cannot go with a node-id file.
func Steps(etc string) ([][]string, error) {
	cfg := filepath.Join(etc, "config.toml")
	if _, err := os.Stat(cfg); err != nil {
		return nil, fmt.Errorf("no configuration: %w (deploy.image writes it with an \"os\" section)", err)
	}
	join := []string{"join", "--config", cfg}
	attestor, err := readAttestor(etc)
	if err != nil {
		return nil, err
	}
	if attestor == "tpm" {
		if _, err := os.Lstat(filepath.Join(etc, "node-id")); !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("etc/bcd/%s says tpm but etc/bcd/node-id names a provisioned node: keep one of them", AttestorFile)
		}
		return [][]string{append(join, "--attestor", "tpm"), {"node", "--config", cfg}}, nil
	}
	b, err := os.ReadFile(filepath.Join(etc, "node-id"))
	switch {
	case err == nil:
		id := strings.TrimSpace(string(b))
		if id == "" || strings.ContainsAny(id, " \t\n/") {
			return nil, errors.New("etc/bcd/node-id is not a node id")
		}
		join = append(join, "--node-id", id)
		if _, err := os.Stat(filepath.Join(etc, "join-token")); err == nil {
			join = append(join, "--token-file", filepath.Join(etc, "join-token"))
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	return [][]string{join, {"node", "--config", cfg}}, nil
}

// readAttestor returns the word in etc's attestor file, "" when there is
// none, and an error for a word other than "tpm".
func readAttestor(etc string) (string, error) {
	b, err := os.ReadFile(filepath.Join(etc, AttestorFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("etc/bcd/%s: %w", AttestorFile, err)
	}
	switch w := strings.TrimSpace(string(b)); w {
	case "tpm":
		return w, nil
	case "":
		return "", fmt.Errorf("etc/bcd/%s is empty: write tpm, or remove it to join with the provisioned node id", AttestorFile)
	default:
		if len(w) > 32 || strings.ContainsFunc(w, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			return "", fmt.Errorf("etc/bcd/%s does not hold one word: the only attestor known is tpm", AttestorFile)
		}
		return "", fmt.Errorf("etc/bcd/%s says %q: the only attestor known is tpm", AttestorFile, w)
	}
}
