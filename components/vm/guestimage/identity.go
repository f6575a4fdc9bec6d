package guestimage

import "github.com/better-compute/bcd/components/vm/domainxml"

// The identity rebind's guest side: when bcd hot-adds an instance's
// identity disk after a memory restore (a virtio disk whose serial is
// domainxml.IdentitySerial, an ISO9660 volume labelled cidata), udev
// starts bcd-identity@<disk>.service, which mounts it read-only, installs
// the ed25519 host key its user data carries (cloud-config ssh_keys) and
// reloads sshd. docs/instances.md ("Identity rebind") says what a tenant
// image needs; these three files are one way to have it.
const (
	identityRulePath   = "etc/udev/rules.d/90-bcd-identity.rules"
	identityUnitPath   = "etc/systemd/system/bcd-identity@.service"
	identityScriptPath = "usr/local/sbin/bcd-identity"
)

// identityRule matches the add of the whole disk (ID_FS_LABEL comes from
// 60-persistent-storage.rules' blkid, before this rule).
const identityRule = `# bcd's identity disk, hot-added to a guest resumed from a memory snapshot.
ACTION=="add", SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", KERNEL=="vd*", ATTRS{serial}=="` + domainxml.IdentitySerial + `", ENV{ID_FS_LABEL}=="cidata", TAG+="systemd", ENV{SYSTEMD_WANTS}+="bcd-identity@%k.service"
`

const identityUnit = `[Unit]
Description=Install the SSH host key of bcd's identity disk /dev/%I
After=local-fs.target

[Service]
Type=oneshot
ExecStart=/` + identityScriptPath + ` %I
StandardOutput=journal+console
StandardError=journal+console
`

// identityScript installs the key: written beside the old keys, checked
// (the private key must give the public one), renamed into place 0600
// and 0644, the other host keys removed (the user data says
// ssh_deletekeys), then sshd reloaded (SIGHUP: it re-executes and reads
// its keys; open sessions stay).
const identityScript = `#!/bin/sh
# bcd identity rebind: installs the SSH host key on bcd's identity disk
# /dev/$1 (started by bcd-identity@.service from 90-bcd-identity.rules).
set -eu
case "$1" in vd[a-z]|vd[a-z][a-z]) ;; *) echo "bcd-identity: $1 is not a virtio disk" >&2; exit 1 ;; esac
mnt=$(mktemp -d)
new=$(mktemp -d /etc/ssh/.bcd-identity.XXXXXX)
trap 'umount "$mnt" 2>/dev/null || true; rmdir "$mnt"; rm -rf "$new"' EXIT
mount -t iso9660 -o ro,nosuid,nodev,noexec "/dev/$1" "$mnt"
umask 077
python3 - "$mnt/user-data" "$new" <<'EOF'
import os, sys, yaml
ud = yaml.safe_load(open(sys.argv[1]))
keys = (ud or {}).get("ssh_keys") or {}
priv, pub = keys.get("ed25519_private"), keys.get("ed25519_public")
if not isinstance(priv, str) or not priv.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n") or \
        not isinstance(pub, str) or not pub.startswith("ssh-ed25519 ") or "\n" in pub.strip():
    sys.exit("bcd-identity: the identity disk carries no ed25519 host key")
open(os.path.join(sys.argv[2], "ssh_host_ed25519_key"), "w").write(priv)
open(os.path.join(sys.argv[2], "ssh_host_ed25519_key.pub"), "w").write(pub.strip() + "\n")
EOF
if [ "$(ssh-keygen -y -f "$new/ssh_host_ed25519_key" | cut -d' ' -f1,2)" != "$(cut -d' ' -f1,2 "$new/ssh_host_ed25519_key.pub")" ]; then
	echo "bcd-identity: the private key does not give the public key" >&2
	exit 1
fi
chown root:root "$new/ssh_host_ed25519_key" "$new/ssh_host_ed25519_key.pub"
chmod 0600 "$new/ssh_host_ed25519_key"
chmod 0644 "$new/ssh_host_ed25519_key.pub"
mv -f "$new/ssh_host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
mv -f "$new/ssh_host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
for k in /etc/ssh/ssh_host_*_key; do
	[ "$k" = /etc/ssh/ssh_host_ed25519_key ] || rm -f "$k" "$k.pub"
done
systemctl reload-or-restart ssh.service
echo "bcd-identity: installed the host key $(ssh-keygen -l -f /etc/ssh/ssh_host_ed25519_key.pub)"
`
