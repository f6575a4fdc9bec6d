package instances

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/components/vm/seed"
	"github.com/better-compute/bcd/components/vm/spec"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// IdentityFile is a restored instance's identity disk in its directory.
const IdentityFile = "identity.iso"

// identityAttached marks an instance whose identity disk was attached.
const identityAttached = "identity-attached"

// IdentityAttacher is what a runtime that hot-adds the identity disk
// offers (libvirt-kvm through libvirt.attach-disk).
type IdentityAttacher interface {
	AttachIdentity(ctx context.Context, id string) error
}

// rebind gives an instance resumed from a memory snapshot its own SSH
// host identity: a fresh ed25519 host key, made here, in identity.iso (a
// NoCloud-shaped volume with a new instance-id and the key as
// cloud-config ssh_keys), hot-added as vdz. The guest's side, which
// installs the key from vdz, belongs in the guest image
// (docs/instances.md, "Identity rebind"). Done once.
func (s *Section) rebind(ctx context.Context, in spec.Instance, dir string) *failure {
	if _, err := os.Lstat(filepath.Join(dir, identityAttached)); err == nil {
		return nil
	}
	rt, ok := s.cfg.Runtime.(IdentityAttacher)
	if !ok {
		return nil
	}
	path := filepath.Join(dir, IdentityFile)
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		priv, pub, err := hostKey()
		if err != nil {
			return fail(false, "identity: %v", err)
		}
		nonce := make([]byte, 4)
		rand.Read(nonce)
		ud := "#cloud-config\nssh_deletekeys: true\nssh_keys:\n  ed25519_private: |\n"
		for _, l := range strings.Split(strings.TrimSuffix(priv, "\n"), "\n") {
			ud += "    " + l + "\n"
		}
		ud += "  ed25519_public: " + pub + "\n"
		if err := seed.WriteFile(path, seed.Seed{InstanceID: in.ID + "-" + hex.EncodeToString(nonce), UserData: []byte(ud)}); err != nil {
			return fail(false, "identity: %v", err)
		}
	}
	if err := rt.AttachIdentity(ctx, in.ID); err != nil {
		return fail(errors.Is(err, vmruntime.ErrForeign), "identity: attaching vdz: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, identityAttached), nil, 0o640); err != nil {
		return fail(false, "identity: %v", err)
	}
	return nil
}

// hostKey makes an ed25519 host key: the private key in OpenSSH's own
// format (openssh-key-v1, unencrypted) and the public key line.
func hostKey() (string, string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", err
	}
	str := func(b []byte) []byte { return binary.BigEndian.AppendUint32(nil, uint32(len(b))) }
	put := func(dst []byte, parts ...[]byte) []byte {
		for _, p := range parts {
			dst = append(append(dst, str(p)...), p...)
		}
		return dst
	}
	blob := put(nil, []byte("ssh-ed25519"), pub)
	check := make([]byte, 4)
	rand.Read(check)
	sec := append(append([]byte{}, check...), check...)
	sec = put(sec, []byte("ssh-ed25519"), pub, priv, []byte("bcd identity rebind"))
	for i := byte(1); len(sec)%8 != 0; i++ {
		sec = append(sec, i)
	}
	out := put([]byte("openssh-key-v1\x00"), []byte("none"), []byte("none"), nil)
	out = binary.BigEndian.AppendUint32(out, 1)
	out = put(out, blob, sec)
	return string(pem.EncodeToMemory(&pem.Block{Type: "OPENSSH PRIVATE KEY", Bytes: out})),
		"ssh-ed25519 " + base64.StdEncoding.EncodeToString(blob), nil
}
