#!/usr/bin/env bash
# Installs what building and testing bcd needs on a Debian machine: the
# Debian packages (when missing, as root) and the Go modules. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null || { echo "deps: Go is not installed (Go 1.26 at /usr/local/go is expected)" >&2; exit 1; }

# command -> Debian package that provides it
need=()
want() { command -v "$1" >/dev/null 2>&1 || need+=("$2"); }
want protoc protobuf-compiler
want swtpm swtpm
want swtpm_setup swtpm-tools
want useradd passwd
want rpm rpm
want lintian lintian
want debootstrap debootstrap
want shellcheck shellcheck
want qemu-system-x86_64 qemu-system-x86
# qemu-img: the systemd tier's guest disk is an overlay on its cached image.
want qemu-img qemu-utils
want zstd zstd
# The NoCloud seed's tests read it back with isoinfo and xorriso.
want isoinfo genisoimage
want xorriso xorriso
# The domain XML renderer's test validates with libvirt's own schema.
want virt-xml-validate libvirt-clients
want xmllint libxml2-utils
# The VM tests start Debian's libvirtd themselves, in a mount namespace of their own.
want libvirtd libvirt-daemon-system
want unshare util-linux
# The instances' network policy is rendered for nft; its tests load it in network namespaces.
want nft nftables
# The metadata service's tests ask it with curl from a guest's network namespace.
want curl curl
# make demo serves its instances' base image over https with openssl s_server.
want openssl openssl
# The multi-gateway tests and make demo-ha put HAProxy (TCP mode) in front of the gateways.
want haproxy haproxy
# The fleet page's e2e test opens it in headless Chromium (--screenshot, --dump-dom).
want chromium chromium
# The gateway's metrics test scrapes bcgw with Debian's Prometheus.
want prometheus prometheus
want wipefs util-linux
ls /boot/vmlinuz-* >/dev/null 2>&1 || need+=(linux-image-amd64)
want dnsmasq dnsmasq-base
want ip iproute2
want ipmi_sim openipmi
want ipmitool ipmitool
want mkfs.ext4 e2fsprogs
# The instances' Debian guest (components/vm/guestimage) is a disk written
# with no loop mount: an MBR by sfdisk, a FAT boot partition with syslinux
# (its MBR code from syslinux-common) through mtools, the root by mkfs.ext4 -d.
want sfdisk fdisk
want mkfs.fat dosfstools
want syslinux syslinux
want mcopy mtools
[ -e /usr/lib/syslinux/mbr/mbr.bin ] || need+=(syslinux-common)
# The systemd tier's stand-in nvidia-driver repository (dpkg-deb is dpkg's).
want dpkg-scanpackages dpkg-dev
want podman podman
want crun crun
want busybox busybox-static
want sshd openssh-server
want ssh openssh-client
want ssh-keygen openssh-client
[ -e /usr/lib/ipxe/qemu/pxe-e1000.rom ] || need+=(ipxe-qemu)
[ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
# The PostgreSQL store's tests make their own cluster with initdb and postgres
# (on PATH, or Debian's /usr/lib/postgresql/<version>/bin).
{ command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || need+=(postgresql)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps: missing ${need[*]}; run as root or: apt-get install ${need[*]}" >&2; exit 1
  fi
  echo "deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The tests run their own sshd on a loopback port: keep the package from
  # starting the system's sshd on port 22 while it installs.
  norc=
  # Nor a Prometheus on port 9090.
  if [[ " ${need[*]} " == *" openssh-server "* || " ${need[*]} " == *" prometheus "* ]] && [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && norc=1
  fi
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  [ -z "$norc" ] || rm -f /usr/sbin/policy-rc.d
fi
go mod download
(cd build/pkg && go mod download)
