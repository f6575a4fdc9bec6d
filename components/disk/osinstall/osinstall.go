// Package osinstall writes into the file system of an OS that deploy.image
// just installed what it needs to join the fleet on its first boot: the
// config.toml rendered from the ramdisk's boot parameters, the same
// join-encryption.jwk, the provisioned join token and the node id it
// joins as (`bcd join --node-id`), and the user data (cloud-init NoCloud
// or Ignition).
//
// The image is not trusted: every path is opened through an os.Root at the
// mounted file system, so a symlink in the image (/etc/bcd -> /) cannot
// make the ramdisk write outside it, and each file is written to a
// temporary name, synced and renamed into place.
package osinstall

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
)

// The paths an installed OS reads, relative to its root file system.
const (
	ConfigPath = "etc/bcd/config.toml"
	JWKPath    = "etc/bcd/join-encryption.jwk"
	TokenPath  = "etc/bcd/join-token"
	NodeIDPath = "etc/bcd/node-id"
	// NoCloudDir is cloud-init's local NoCloud seed directory.
	NoCloudDir = "var/lib/cloud/seed/nocloud"
	// IgnitionPath is where coreos-installer leaves an Ignition config on
	// the boot file system, read by Ignition's metal platform.
	IgnitionPath = "ignition/config.ign"
)

// User data formats.
const (
	NoCloud  = "nocloud"
	Ignition = "ignition"
)

// Files is what to write. Empty fields are not written.
type Files struct {
	ConfigTOML []byte // 0600
	JWK        []byte // 0644
	Token      []byte // 0600; the provisioned join token
	NodeID     string // 0644; the node the OS joins as
	UserData   []byte
	Format     string // NoCloud or Ignition, with UserData
	// InstanceID names the NoCloud instance (meta-data's instance-id);
	// NodeID when empty.
	InstanceID string
}

// CheckFormat checks a user data format name.
func CheckFormat(f string) error {
	switch f {
	case NoCloud, Ignition:
		return nil
	}
	return fmt.Errorf("user data format %q: must be %s or %s", f, NoCloud, Ignition)
}

// Write writes f under root and returns the paths it wrote, in order.
func Write(root *os.Root, f Files) ([]string, error) {
	var written []string
	put := func(p string, data []byte, mode os.FileMode) error {
		if err := writeFile(root, p, data, mode); err != nil {
			return err
		}
		written = append(written, "/"+p)
		return nil
	}
	if len(f.UserData) > 0 {
		if err := CheckFormat(f.Format); err != nil {
			return nil, err
		}
	}
	if len(f.ConfigTOML) > 0 {
		if err := put(ConfigPath, f.ConfigTOML, 0o600); err != nil {
			return written, err
		}
	}
	if len(f.JWK) > 0 {
		if err := put(JWKPath, f.JWK, 0o644); err != nil {
			return written, err
		}
	}
	if f.NodeID != "" {
		if strings.ContainsAny(f.NodeID, "\n/\x00") {
			return written, errors.New("node id is not one line")
		}
		if err := put(NodeIDPath, []byte(f.NodeID+"\n"), 0o644); err != nil {
			return written, err
		}
	}
	if len(f.Token) > 0 {
		if err := put(TokenPath, f.Token, 0o600); err != nil {
			return written, err
		}
	}
	switch {
	case len(f.UserData) == 0:
	case f.Format == NoCloud:
		id := f.InstanceID
		if id == "" {
			id = f.NodeID
		}
		if id == "" || strings.ContainsAny(id, "\n\r\x00") {
			return written, errors.New("NoCloud user data needs an instance id (the node id)")
		}
		if err := put(path.Join(NoCloudDir, "user-data"), f.UserData, 0o600); err != nil {
			return written, err
		}
		meta := fmt.Sprintf("instance-id: %q\nlocal-hostname: %q\n", id, id)
		if err := put(path.Join(NoCloudDir, "meta-data"), []byte(meta), 0o600); err != nil {
			return written, err
		}
	case f.Format == Ignition:
		if err := put(IgnitionPath, f.UserData, 0o600); err != nil {
			return written, err
		}
	}
	return written, nil
}

// writeFile writes one file through root: its directories are created
// (0755) where missing, the data goes to a new temporary file that is
// synced and renamed over p. Anything but a regular file at p is refused.
func writeFile(root *os.Root, p string, data []byte, mode os.FileMode) error {
	dir := path.Dir(p)
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("mkdir /%s: %w", dir, err)
	}
	if st, err := root.Lstat(p); err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("/%s is a %s in the image, not a regular file", p, st.Mode().Type())
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("lstat /%s: %w", p, err)
	}
	tmp := p + ".bcd-tmp"
	_ = root.Remove(tmp)
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("create /%s: %w", tmp, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode) // whatever the umask
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, p)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("write /%s: %w", p, err)
	}
	return nil
}
