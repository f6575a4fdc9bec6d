package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A spec is one package before it is built for a format.
type spec struct {
	Name        string
	Arch        string // GOARCH of its binaries, or "all"
	Summary     string // one line
	Description string // the long description, plain paragraphs
	License     string
	Conflicts   []string
	Depends     map[string][]string // by format: what the maintainer scripts run that the base system may lack
	Files       []entry
	Scripts     *scriptData // nil: no maintainer scripts
	Binaries    []string    // what `make sizes` prints next to the package
	StaticELF   []string    // installed static binaries (a lintian override each)
	Man         string      // the man page of build/man it ships in section 1
}

// An entry is one file or directory of a package.
type entry struct {
	Dst  string // absolute; a unit's is only its file name (see unitDirs)
	Src  string // "" for a directory
	Mode fs.FileMode
	Unit bool // a systemd unit: installed in the format's unit directory
	Conf bool // the operator's to edit: a conffile, kept on upgrades
}

// scriptData fills the maintainer script templates.
type scriptData struct {
	Package string
	Enable  string // units enabled on the first install, never started by it
	Restart string // units restarted after an upgrade, only if running
	Stop    string // units stopped when the package is removed
	Helper  bool   // the bcd account's helper setup path
	Gateway bool   // bcgw: its account and key-encryption key, no /var/lib/bcd
}

// unitDirs is where each format installs units: Debian bookworm's
// packages still ship them in /lib (merged /usr makes both the same
// directory); RPM distributions use /usr/lib.
var unitDirs = map[string]string{"deb": "/lib/systemd/system", "rpm": "/usr/lib/systemd/system"}

// ramdiskFiles are the artifacts of `make image`, each with its SHA-256.
var ramdiskFiles = []string{"vmlinuz", "initramfs.cpio.zst", "ramdisk.ipxe"}

// nodeSpec is bcd-node: the node binary as /usr/bin/bcd, the helper
// binary, the units and the unprivileged drop-in (activated only by
// install.sh --unprivileged).
func nodeSpec(o *options, arch string) spec {
	bin := filepath.Join(o.bin, arch)
	return spec{
		Name:    "bcd-node",
		Arch:    arch,
		Summary: "Better Compute daemon: the node agent",
		Description: "bcd runs on every server of a Better Compute fleet: it dials out to a " +
			"regional gateway over pinned mTLS, reports what the machine is, runs the typed " +
			"commands the control plane sends exactly once, and converges the machine toward " +
			"its desired state.\n\n" +
			"This package holds the node agent as /usr/bin/bcd, bcd helper (the root half of " +
			"privilege separation) and their systemd units. It starts nothing by itself: " +
			"/usr/share/bcd/install.sh (build/install.sh of the source) writes " +
			"/etc/bcd/config.toml, joins and starts the agent.",
		License:   o.license,
		Conflicts: []string{"bcd-site"},
		// bcd-account (the postinst's, on a host set up for the helper)
		// runs useradd and gpasswd; see gatewaySpec.
		Depends: map[string][]string{"deb": {"passwd"}, "rpm": {"/bin/sh", "/usr/sbin/useradd", "/usr/sbin/gpasswd"}},
		Files: []entry{
			{Dst: "/usr/bin/bcd", Src: filepath.Join(bin, "bcd-node"), Mode: 0o755},
			{Dst: "/usr/libexec/bcd/bcd-helper", Src: filepath.Join(bin, "bcd-helper"), Mode: 0o755},
			{Dst: "/usr/libexec/bcd/bcd-account", Src: filepath.Join(o.self, "files", "bcd-account"), Mode: 0o755},
			{Dst: "bcd.service", Src: filepath.Join(o.systemd, "bcd.service"), Mode: 0o644, Unit: true},
			{Dst: "bcd-join.service", Src: filepath.Join(o.systemd, "bcd-join.service"), Mode: 0o644, Unit: true},
			{Dst: "bcd-helper.service", Src: filepath.Join(o.systemd, "bcd-helper.service"), Mode: 0o644, Unit: true},
			{Dst: "bcd-rollback@.service", Src: filepath.Join(o.systemd, "bcd-rollback@.service"), Mode: 0o644, Unit: true},
			{Dst: "/usr/share/bcd/bcd.service.d/10-unprivileged.conf", Src: filepath.Join(o.systemd, "bcd.service.d", "10-unprivileged.conf"), Mode: 0o644},
			{Dst: "/usr/share/bcd/install.sh", Src: filepath.Join(o.build, "install.sh"), Mode: 0o755},
			{Dst: "/etc/bcd", Mode: 0o755},
		},
		Scripts: &scriptData{
			Package: "bcd-node",
			Enable:  "bcd-join.service bcd.service",
			Restart: "bcd-helper.service bcd.service",
			Stop:    "bcd.service bcd-join.service bcd-helper.service",
			Helper:  true,
		},
		Binaries:  []string{filepath.Join(bin, "bcd-node"), filepath.Join(bin, "bcd-helper")},
		StaticELF: []string{"/usr/bin/bcd", "/usr/libexec/bcd/bcd-helper"},
		Man:       "bcd.1",
	}
}

// siteSpec is bcd-site: the site binary, also as /usr/bin/bcd (the
// command operators type is bcd on every machine), so it conflicts with
// bcd-node.
func siteSpec(o *options, arch string) spec {
	bin := filepath.Join(o.bin, arch)
	return spec{
		Name:    "bcd-site",
		Arch:    arch,
		Summary: "Better Compute daemon: the site agent",
		Description: "bcd site runs beside a site's machines: the agent that drives their BMCs, " +
			"and the boot server that answers PXE (proxy DHCP, TFTP, iPXE scripts) from a " +
			"verified image cache while it holds the site's boot lease.\n\n" +
			"This package holds the site agent as /usr/bin/bcd and bcd-site.service. " +
			"/usr/share/bcd/install.sh --role site (build/install.sh of the source) writes " +
			"/etc/bcd/config.toml, joins and starts it. A machine is a node or a site, so it " +
			"conflicts with bcd-node.",
		License:   o.license,
		Conflicts: []string{"bcd-node"},
		Depends:   map[string][]string{"rpm": {"/bin/sh"}},
		Files: []entry{
			{Dst: "/usr/bin/bcd", Src: filepath.Join(bin, "bcd-site"), Mode: 0o755},
			{Dst: "bcd-site.service", Src: filepath.Join(o.systemd, "bcd-site.service"), Mode: 0o644, Unit: true},
			{Dst: "bcd-rollback@.service", Src: filepath.Join(o.systemd, "bcd-rollback@.service"), Mode: 0o644, Unit: true},
			{Dst: "/usr/share/bcd/install.sh", Src: filepath.Join(o.build, "install.sh"), Mode: 0o755},
			{Dst: "/etc/bcd", Mode: 0o755},
		},
		Scripts: &scriptData{
			Package: "bcd-site",
			Enable:  "bcd-site.service",
			Restart: "bcd-site.service",
			Stop:    "bcd-site.service",
		},
		Binaries:  []string{filepath.Join(bin, "bcd-site")},
		StaticELF: []string{"/usr/bin/bcd"},
		Man:       "bcd.1",
	}
}

// gatewaySpec is bcgw: the gateway as /usr/bin/bcgw, bcgw.service (its
// own account, made by the maintainer scripts) and the template
// bcgw@.service for more gateways on one host, the flags' environment
// file as a conffile and bcgw(1).
func gatewaySpec(o *options, arch string) spec {
	bin := filepath.Join(o.bin, arch)
	return spec{
		Name:    "bcgw",
		Arch:    arch,
		Summary: "Better Compute gateway and control plane",
		Description: "bcgw is the gateway bcd agents dial out to: it joins nodes with tokens, " +
			"serves their sessions over pinned mTLS, keeps their desired state and sends " +
			"them signed commands. Several gateways on one PostgreSQL database serve a " +
			"fleet behind a load balancer.\n\n" +
			"This package holds /usr/bin/bcgw and bcgw.service, which runs it as the bcgw " +
			"system account with the key-encryption key /etc/bcgw/kek as a systemd " +
			"credential and the flags of /etc/bcgw/bcgw.env, and the template " +
			"bcgw@.service for further gateways on the same host (flags in " +
			"/etc/bcgw/NAME.env). It makes the account and the key and enables " +
			"bcgw.service, but starts nothing by itself.",
		License: o.license,
		// The postinst makes the account with useradd: Debian's passwd,
		// the shadow utilities of RPM distributions (named by the file,
		// as Fedora's shadow-utils and openSUSE's shadow both provide it).
		Depends: map[string][]string{"deb": {"passwd"}, "rpm": {"/bin/sh", "/usr/sbin/useradd"}},
		Files: []entry{
			{Dst: "/usr/bin/bcgw", Src: filepath.Join(bin, "bcgw"), Mode: 0o755},
			{Dst: "bcgw.service", Src: filepath.Join(o.systemd, "bcgw.service"), Mode: 0o644, Unit: true},
			{Dst: "bcgw@.service", Src: filepath.Join(o.systemd, "bcgw@.service"), Mode: 0o644, Unit: true},
			{Dst: "/etc/bcgw/bcgw.env", Src: filepath.Join(o.self, "files", "bcgw.env"), Mode: 0o644, Conf: true},
			{Dst: "/etc/bcgw", Mode: 0o755},
		},
		Scripts: &scriptData{
			Package: "bcgw",
			Enable:  "bcgw.service",
			Restart: "bcgw.service",
			Stop:    "bcgw.service",
			Gateway: true,
		},
		Binaries:  []string{filepath.Join(bin, "bcgw")},
		StaticELF: []string{"/usr/bin/bcgw"},
		Man:       "bcgw.1",
	}
}

// ramdiskSpec is bcd-ramdisk-image-ARCH: the PXE ramdisk a site boots
// ARCH machines with. The artifacts are data for the site's image cache,
// not code for the site itself, so the package is architecture-independent
// (an amd64 site can serve arm64 machines) and named by the machines'
// architecture. It returns ok false, with the reason, when dir holds no
// ramdisk; an artifact whose digest is not its .sha256 file's is an error.
func ramdiskSpec(o *options, arch string) (s spec, ok bool, why string, err error) {
	dir := filepath.Join(o.images, arch)
	if _, err := os.Stat(dir); err != nil && arch == "amd64" {
		// `make image` (issue 5) writes the amd64 ramdisk into images/out
		// itself; another architecture's goes into images/out/ARCH.
		dir = o.images
	}
	for _, f := range ramdiskFiles {
		for _, name := range []string{f, f + ".sha256"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				return spec{}, false, fmt.Sprintf("no %s ramdisk: %s is missing (make image builds images/out)", arch, filepath.Join(dir, name)), nil
			}
		}
	}
	name := "bcd-ramdisk-image-" + arch
	s = spec{
		Name:    name,
		Arch:    "all",
		Summary: "Better Compute PXE ramdisk for " + arch + " machines",
		Description: "The kernel, initramfs and iPXE script a bcd site agent boots " + arch + " " +
			"machines with (bcd ramdisk inside a u-root initramfs), each with its SHA-256, " +
			"under /usr/share/bcd/ramdisk/" + arch + "/ for the site's image cache.",
		License: o.license + " AND GPL-2.0-only AND BSD-3-Clause",
	}
	if arch == "amd64" {
		// images/out is flat: make sure what it holds is an x86 kernel
		// before calling it the amd64 ramdisk.
		if err := checkBzImage(filepath.Join(dir, "vmlinuz")); err != nil {
			return spec{}, false, "", err
		}
	}
	for _, f := range ramdiskFiles {
		src := filepath.Join(dir, f)
		if err := checkDigest(src, src+".sha256"); err != nil {
			return spec{}, false, "", err
		}
		for _, n := range []string{f, f + ".sha256"} {
			s.Files = append(s.Files, entry{Dst: "/usr/share/bcd/ramdisk/" + arch + "/" + n, Src: filepath.Join(dir, n), Mode: 0o644})
		}
		s.Binaries = append(s.Binaries, src)
	}
	return s, true, "", nil
}

// checkBzImage checks that path is an x86 kernel: a bzImage has the boot
// protocol's "HdrS" signature at offset 0x202.
func checkBzImage(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := f.ReadAt(magic, 0x202); err != nil || string(magic) != "HdrS" {
		return fmt.Errorf("%s is not an x86 bzImage (no HdrS at 0x202): not packaged as the amd64 ramdisk (another architecture's ramdisk goes in its own directory, e.g. images/out/arm64/)", path)
	}
	return nil
}

// checkDigest compares a file's SHA-256 with the first field of its
// .sha256 file (sha256sum's format, or the bare hex digest).
func checkDigest(path, sumPath string) error {
	want, err := os.ReadFile(sumPath)
	if err != nil {
		return err
	}
	fields := strings.Fields(string(want))
	if len(fields) == 0 {
		return fmt.Errorf("%s is empty", sumPath)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); !strings.EqualFold(got, fields[0]) {
		return fmt.Errorf("%s: SHA-256 %s, but %s says %s", path, got, sumPath, fields[0])
	}
	return nil
}

// missingBinary names a missing binary and what builds it.
func missingBinary(path string) error {
	return fmt.Errorf("%s is missing: build/packages.sh cross-compiles each architecture's binaries into BIN/ARCH/", path)
}
