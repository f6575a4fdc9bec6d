// Package ipxe renders the iPXE scripts the site agent's boot server hands
// a PXE machine over HTTP: boot a kernel and initramfs with a command line
// (the bc.* boot parameters among it), sanboot a cached ISO, or exit so the
// firmware tries its next boot device when the machine has no boot entry.
//
// Scripts are plain: no imgverify, no menus, no settings expansion. Every
// value put into a script is checked so that nothing can add a line, a
// command or an iPXE ${...} expansion to it.
package ipxe

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Boot is what one machine boots.
type Boot struct {
	// Kernel is the http(s) URL of the kernel.
	Kernel string
	// Initrd is the http(s) URL of the initramfs.
	Initrd string
	// Cmdline is the kernel command line: console and panic arguments and
	// the bc.* parameters from bootparams.Render. The script adds
	// initrd=initrd itself, which the EFI stub needs to find the initramfs.
	Cmdline string
}

// MaxCmdlineLen bounds Boot.Cmdline, below the 2048 bytes of the kernel's
// command line on x86-64 and arm64 (the script adds initrd=initrd).
const MaxCmdlineLen = 2000

// initrdName is the name the initramfs gets inside iPXE and on the kernel
// command line.
const initrdName = "initrd"

// Script renders the iPXE script that boots b.
func Script(b Boot) (string, error) {
	if err := checkURL(b.Kernel); err != nil {
		return "", fmt.Errorf("rendering iPXE script: kernel: %w", err)
	}
	if err := checkURL(b.Initrd); err != nil {
		return "", fmt.Errorf("rendering iPXE script: initrd: %w", err)
	}
	if err := checkCmdline(b.Cmdline); err != nil {
		return "", fmt.Errorf("rendering iPXE script: command line: %w", err)
	}
	args := "initrd=" + initrdName
	if b.Cmdline != "" {
		args += " " + b.Cmdline
	}
	var s strings.Builder
	s.WriteString("#!ipxe\n")
	s.WriteString("echo bcd: loading the kernel and initramfs\n")
	fmt.Fprintf(&s, "kernel %s %s || goto failed\n", b.Kernel, args)
	fmt.Fprintf(&s, "initrd --name %s %s || goto failed\n", initrdName, b.Initrd)
	s.WriteString("boot || goto failed\n")
	s.WriteString(failed)
	return s.String(), nil
}

// Sanboot renders the iPXE script that boots the ISO at isoURL over HTTP,
// for an entry that boots an installer ISO from the image cache.
func Sanboot(isoURL string) (string, error) {
	if err := checkURL(isoURL); err != nil {
		return "", fmt.Errorf("rendering iPXE sanboot script: %w", err)
	}
	return "#!ipxe\n" +
		"echo bcd: booting the ISO\n" +
		"sanboot --no-describe " + isoURL + " || goto failed\n" +
		failed, nil
}

// Exit is the script for a machine without a boot entry: iPXE exits and
// the firmware goes on to its next boot device.
func Exit() string {
	return "#!ipxe\n" +
		"echo bcd: no boot entry for this machine\n" +
		"exit\n"
}

// failed ends every booting script: a failed download or boot exits to the
// firmware instead of leaving the machine at an iPXE prompt.
const failed = ":failed\n" +
	"echo bcd: boot failed\n" +
	"sleep 5\n" +
	"exit 1\n"

// checkURL accepts an absolute http or https URL without user information
// or fragment, and nothing an iPXE script line could be broken by.
func checkURL(s string) error {
	if s == "" {
		return errors.New("empty; want an http(s):// URL")
	}
	if len(s) > 1024 {
		return errors.New("longer than 1024 bytes")
	}
	if err := checkPlain(s); err != nil {
		return err
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("is not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("must be an http:// or https:// URL")
	}
	if u.Host == "" {
		return errors.New("needs a host")
	}
	if u.User != nil {
		return errors.New("must not contain a user name or password")
	}
	if strings.Contains(s, "#") {
		return errors.New("must not have a fragment")
	}
	return nil
}

// checkCmdline accepts words of plain bytes separated by single spaces.
func checkCmdline(s string) error {
	if len(s) > MaxCmdlineLen {
		return fmt.Errorf("longer than %d bytes", MaxCmdlineLen)
	}
	if s == "" {
		return nil
	}
	for w := range strings.SplitSeq(s, " ") {
		if w == "" {
			return errors.New("has an empty word (leading, trailing or double space)")
		}
		if err := checkPlain(w); err != nil {
			return err
		}
		if w == "&&" {
			return errors.New("must not contain the word && (an iPXE command separator)")
		}
		if strings.HasPrefix(w, "initrd=") {
			return errors.New("must not name an initrd (the script adds initrd=initrd)")
		}
	}
	return nil
}

// checkPlain refuses spaces, control characters, non-ASCII bytes, quotes,
// backslashes, $, | and ;, which iPXE would split, mangle, expand or take
// as the end of a command.
func checkPlain(s string) error {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c <= ' ' || c >= 0x7f:
			return errors.New("must not contain spaces, control characters or non-ASCII bytes")
		case c == '"' || c == '\'' || c == '`' || c == '\\':
			return errors.New("must not contain quotes or backslashes")
		case c == '$':
			return errors.New("must not contain $ (iPXE expands ${...})")
		case c == '|' || c == ';':
			return errors.New("must not contain | or ; (iPXE command separators)")
		}
	}
	return nil
}
