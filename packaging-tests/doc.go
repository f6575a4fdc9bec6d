// Package packagingtests tests bcd's packages (build/packages.sh and the
// builder in build/pkg): it builds bcd-node, bcd-site and the ramdisk image
// packages as .deb and .rpm for amd64 and arm64, checks that dpkg -c and
// rpm -qlp list exactly the expected files, that lintian reports no errors
// and the units pass systemd-analyze verify, and installs the amd64 .deb
// into a clean Debian root made with debootstrap: bcd version, the units,
// build/install.sh --unprivileged joining a real bcgw, and an upgrade that
// keeps an edited config.toml. See docs/packages.md.
package packagingtests
