package packagingtests

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The exact contents of each package, as "mode owner path" lines. A
// directory ends with "/". The .debs carry their parent directories as
// dpkg expects; the .rpms own only /etc/bcd of theirs.
var (
	debNode = []string{
		"drwxr-xr-x root/root ./etc/",
		"drwxr-xr-x root/root ./etc/bcd/",
		"drwxr-xr-x root/root ./lib/",
		"drwxr-xr-x root/root ./lib/systemd/",
		"drwxr-xr-x root/root ./lib/systemd/system/",
		"-rw-r--r-- root/root ./lib/systemd/system/bcd-helper.service",
		"-rw-r--r-- root/root ./lib/systemd/system/bcd-join.service",
		"-rw-r--r-- root/root ./lib/systemd/system/bcd-rollback@.service",
		"-rw-r--r-- root/root ./lib/systemd/system/bcd.service",
		"drwxr-xr-x root/root ./usr/",
		"drwxr-xr-x root/root ./usr/bin/",
		"-rwxr-xr-x root/root ./usr/bin/bcd",
		"drwxr-xr-x root/root ./usr/libexec/",
		"drwxr-xr-x root/root ./usr/libexec/bcd/",
		"-rwxr-xr-x root/root ./usr/libexec/bcd/bcd-account",
		"-rwxr-xr-x root/root ./usr/libexec/bcd/bcd-helper",
		"drwxr-xr-x root/root ./usr/share/",
		"drwxr-xr-x root/root ./usr/share/bcd/",
		"drwxr-xr-x root/root ./usr/share/bcd/bcd.service.d/",
		"-rw-r--r-- root/root ./usr/share/bcd/bcd.service.d/10-unprivileged.conf",
		"-rwxr-xr-x root/root ./usr/share/bcd/install.sh",
		"drwxr-xr-x root/root ./usr/share/doc/",
		"drwxr-xr-x root/root ./usr/share/doc/bcd-node/",
		"-rw-r--r-- root/root ./usr/share/doc/bcd-node/changelog.gz",
		"-rw-r--r-- root/root ./usr/share/doc/bcd-node/copyright",
		"drwxr-xr-x root/root ./usr/share/lintian/",
		"drwxr-xr-x root/root ./usr/share/lintian/overrides/",
		"-rw-r--r-- root/root ./usr/share/lintian/overrides/bcd-node",
		"drwxr-xr-x root/root ./usr/share/man/",
		"drwxr-xr-x root/root ./usr/share/man/man1/",
		"-rw-r--r-- root/root ./usr/share/man/man1/bcd.1.gz",
	}
	debSite = []string{
		"drwxr-xr-x root/root ./etc/",
		"drwxr-xr-x root/root ./etc/bcd/",
		"drwxr-xr-x root/root ./lib/",
		"drwxr-xr-x root/root ./lib/systemd/",
		"drwxr-xr-x root/root ./lib/systemd/system/",
		"-rw-r--r-- root/root ./lib/systemd/system/bcd-rollback@.service",
		"-rw-r--r-- root/root ./lib/systemd/system/bcd-site.service",
		"drwxr-xr-x root/root ./usr/",
		"drwxr-xr-x root/root ./usr/bin/",
		"-rwxr-xr-x root/root ./usr/bin/bcd",
		"drwxr-xr-x root/root ./usr/share/",
		"drwxr-xr-x root/root ./usr/share/bcd/",
		"-rwxr-xr-x root/root ./usr/share/bcd/install.sh",
		"drwxr-xr-x root/root ./usr/share/doc/",
		"drwxr-xr-x root/root ./usr/share/doc/bcd-site/",
		"-rw-r--r-- root/root ./usr/share/doc/bcd-site/changelog.gz",
		"-rw-r--r-- root/root ./usr/share/doc/bcd-site/copyright",
		"drwxr-xr-x root/root ./usr/share/lintian/",
		"drwxr-xr-x root/root ./usr/share/lintian/overrides/",
		"-rw-r--r-- root/root ./usr/share/lintian/overrides/bcd-site",
		"drwxr-xr-x root/root ./usr/share/man/",
		"drwxr-xr-x root/root ./usr/share/man/man1/",
		"-rw-r--r-- root/root ./usr/share/man/man1/bcd.1.gz",
	}
	rpmNode = []string{
		"drwxr-xr-x root/root /etc/bcd",
		"-rwxr-xr-x root/root /usr/bin/bcd",
		"-rw-r--r-- root/root /usr/lib/systemd/system/bcd-helper.service",
		"-rw-r--r-- root/root /usr/lib/systemd/system/bcd-join.service",
		"-rw-r--r-- root/root /usr/lib/systemd/system/bcd-rollback@.service",
		"-rw-r--r-- root/root /usr/lib/systemd/system/bcd.service",
		"-rwxr-xr-x root/root /usr/libexec/bcd/bcd-account",
		"-rwxr-xr-x root/root /usr/libexec/bcd/bcd-helper",
		"-rw-r--r-- root/root /usr/share/bcd/bcd.service.d/10-unprivileged.conf",
		"-rwxr-xr-x root/root /usr/share/bcd/install.sh",
		"-rw-r--r-- root/root /usr/share/man/man1/bcd.1.gz",
	}
	rpmSite = []string{
		"drwxr-xr-x root/root /etc/bcd",
		"-rwxr-xr-x root/root /usr/bin/bcd",
		"-rw-r--r-- root/root /usr/lib/systemd/system/bcd-rollback@.service",
		"-rw-r--r-- root/root /usr/lib/systemd/system/bcd-site.service",
		"-rwxr-xr-x root/root /usr/share/bcd/install.sh",
		"-rw-r--r-- root/root /usr/share/man/man1/bcd.1.gz",
	}
	debGateway = []string{
		"drwxr-xr-x root/root ./etc/",
		"drwxr-xr-x root/root ./etc/bcgw/",
		"-rw-r--r-- root/root ./etc/bcgw/bcgw.env",
		"drwxr-xr-x root/root ./lib/",
		"drwxr-xr-x root/root ./lib/systemd/",
		"drwxr-xr-x root/root ./lib/systemd/system/",
		"-rw-r--r-- root/root ./lib/systemd/system/bcgw.service",
		"-rw-r--r-- root/root ./lib/systemd/system/bcgw@.service",
		"drwxr-xr-x root/root ./usr/",
		"drwxr-xr-x root/root ./usr/bin/",
		"-rwxr-xr-x root/root ./usr/bin/bcgw",
		"drwxr-xr-x root/root ./usr/share/",
		"drwxr-xr-x root/root ./usr/share/doc/",
		"drwxr-xr-x root/root ./usr/share/doc/bcgw/",
		"-rw-r--r-- root/root ./usr/share/doc/bcgw/changelog.gz",
		"-rw-r--r-- root/root ./usr/share/doc/bcgw/copyright",
		"drwxr-xr-x root/root ./usr/share/lintian/",
		"drwxr-xr-x root/root ./usr/share/lintian/overrides/",
		"-rw-r--r-- root/root ./usr/share/lintian/overrides/bcgw",
		"drwxr-xr-x root/root ./usr/share/man/",
		"drwxr-xr-x root/root ./usr/share/man/man1/",
		"-rw-r--r-- root/root ./usr/share/man/man1/bcgw.1.gz",
	}
	rpmGateway = []string{
		"drwxr-xr-x root/root /etc/bcgw",
		"-rw-r--r-- root/root /etc/bcgw/bcgw.env",
		"-rwxr-xr-x root/root /usr/bin/bcgw",
		"-rw-r--r-- root/root /usr/lib/systemd/system/bcgw.service",
		"-rw-r--r-- root/root /usr/lib/systemd/system/bcgw@.service",
		"-rw-r--r-- root/root /usr/share/man/man1/bcgw.1.gz",
	}
)

func debRamdisk(arch string) []string {
	out := []string{
		"drwxr-xr-x root/root ./usr/",
		"drwxr-xr-x root/root ./usr/share/",
		"drwxr-xr-x root/root ./usr/share/bcd/",
		"drwxr-xr-x root/root ./usr/share/bcd/ramdisk/",
		"drwxr-xr-x root/root ./usr/share/bcd/ramdisk/" + arch + "/",
	}
	for _, f := range []string{"initramfs.cpio.zst", "initramfs.cpio.zst.sha256", "ramdisk.ipxe", "ramdisk.ipxe.sha256", "vmlinuz", "vmlinuz.sha256"} {
		out = append(out, "-rw-r--r-- root/root ./usr/share/bcd/ramdisk/"+arch+"/"+f)
	}
	return append(out,
		"drwxr-xr-x root/root ./usr/share/doc/",
		"drwxr-xr-x root/root ./usr/share/doc/bcd-ramdisk-image-"+arch+"/",
		"-rw-r--r-- root/root ./usr/share/doc/bcd-ramdisk-image-"+arch+"/changelog.gz",
		"-rw-r--r-- root/root ./usr/share/doc/bcd-ramdisk-image-"+arch+"/copyright",
	)
}

func rpmRamdisk(arch string) []string {
	var out []string
	for _, f := range []string{"initramfs.cpio.zst", "initramfs.cpio.zst.sha256", "ramdisk.ipxe", "ramdisk.ipxe.sha256", "vmlinuz", "vmlinuz.sha256"} {
		out = append(out, "-rw-r--r-- root/root /usr/share/bcd/ramdisk/"+arch+"/"+f)
	}
	return out
}

// debListing is `dpkg -c` as "mode owner path" lines.
func debListing(t *testing.T, pkg string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(run(t, "", "dpkg", "-c", pkg)), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			t.Fatalf("dpkg -c %s: odd line %q", pkg, l)
		}
		out = append(out, f[0]+" "+f[1]+" "+strings.Join(f[5:], " "))
	}
	return out
}

// rpmListing is `rpm -qlp`, each path with its mode and owner.
func rpmListing(t *testing.T, pkg string) []string {
	t.Helper()
	paths := strings.Split(strings.TrimSpace(run(t, "", "rpm", "-qlp", pkg)), "\n")
	modes := strings.Split(strings.TrimSpace(run(t, "", "rpm", "-qp", "--qf", `[%{FILEMODES:perms} %{FILEUSERNAME}/%{FILEGROUPNAME} %{FILENAMES}\n]`, pkg)), "\n")
	if len(paths) != len(modes) {
		t.Fatalf("rpm -qlp %s lists %d files, its headers %d", pkg, len(paths), len(modes))
	}
	for i, m := range modes {
		if !strings.HasSuffix(m, " "+paths[i]) {
			t.Fatalf("rpm %s: %q does not name %s", pkg, m, paths[i])
		}
	}
	return modes
}

func sameList(t *testing.T, what string, got, want []string) {
	t.Helper()
	got, want = append([]string(nil), got...), append([]string(nil), want...)
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s lists\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestListings: dpkg -c and rpm -qlp list exactly the expected files,
// with their modes and owners, for both architectures.
func TestListings(t *testing.T) {
	need(t, "dpkg", "dpkg")
	need(t, "rpm", "rpm")
	built(t)
	for _, arch := range []string{"amd64", "arm64"} {
		for _, c := range []struct {
			name, arch string
			deb, rpm   []string
		}{
			{"bcd-node", arch, debNode, rpmNode},
			{"bcd-site", arch, debSite, rpmSite},
			{"bcgw", arch, debGateway, rpmGateway},
			{"bcd-ramdisk-image-" + arch, "all", debRamdisk(arch), rpmRamdisk(arch)},
		} {
			deb := filepath.Join(fx.pkgs1, debName(c.name, v1, c.arch))
			sameList(t, "dpkg -c "+filepath.Base(deb), debListing(t, deb), c.deb)
			rpm := filepath.Join(fx.pkgs1, rpmName(c.name, v1, c.arch))
			sameList(t, "rpm -qlp "+filepath.Base(rpm), rpmListing(t, rpm), c.rpm)
		}
	}
	// Nothing else was built: two architectures, four packages, two formats.
	entries, err := os.ReadDir(fx.pkgs1)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 16 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("%s holds %d files, want 16: %v", fx.pkgs1, len(entries), names)
	}
}

// TestMetadata: versions, architectures, conflicts, dependencies,
// maintainer, license; no conffiles in the agents' packages (config.toml
// is written by install.sh, never shipped), bcgw's environment file as
// its one; the maintainer scripts where expected.
func TestMetadata(t *testing.T) {
	need(t, "dpkg", "dpkg")
	need(t, "rpm", "rpm")
	built(t)
	for _, arch := range []string{"amd64", "arm64"} {
		for _, c := range []struct {
			name, arch, conflicts string
			scripts               bool
			conffile              string
			depends, requires     string // the deb's Depends, the rpm's requirements (rpm -qp --requires)
		}{
			{"bcd-node", arch, "bcd-site", true, "", "passwd", "/bin/sh /usr/sbin/useradd /usr/sbin/gpasswd"},
			{"bcd-site", arch, "bcd-node", true, "", "", "/bin/sh"},
			{"bcgw", arch, "", true, "/etc/bcgw/bcgw.env", "passwd", "/bin/sh /usr/sbin/useradd"},
			{"bcd-ramdisk-image-" + arch, "all", "", false, "", "", ""},
		} {
			deb := filepath.Join(fx.pkgs1, debName(c.name, v1, c.arch))
			fields := run(t, "", "dpkg-deb", "-f", deb, "Package", "Version", "Architecture", "Depends", "Conflicts", "Section", "Priority")
			want := "Package: " + c.name + "\nVersion: " + v1 + "\nArchitecture: " + c.arch + "\n"
			if c.depends != "" {
				want += "Depends: " + c.depends + "\n"
			}
			if c.conflicts != "" {
				want += "Conflicts: " + c.conflicts + "\n"
			}
			want += "Section: admin\nPriority: optional\n"
			if fields != want {
				t.Errorf("%s: control fields\n%s\nwant\n%s", filepath.Base(deb), fields, want)
			}
			if m := run(t, "", "dpkg-deb", "-f", deb, "Maintainer"); !regexp.MustCompile(`^.+ <[^@ ]+@[^@ ]+>\n$`).MatchString(m) {
				t.Errorf("%s: %q is not a maintainer with an address", filepath.Base(deb), m)
			}
			wantCtrl := []string{"./control", "./md5sums"}
			if c.conffile != "" {
				wantCtrl = append(wantCtrl, "./conffiles")
				if got := strings.TrimSpace(controlFile(t, deb, "./conffiles")); got != c.conffile {
					t.Errorf("%s conffiles %q, want %q", filepath.Base(deb), got, c.conffile)
				}
			}
			if c.scripts {
				wantCtrl = append(wantCtrl, "./postinst", "./postrm", "./prerm")
			}
			sameList(t, filepath.Base(deb)+" control archive", controlMembers(t, deb), wantCtrl)

			rpm := filepath.Join(fx.pkgs1, rpmName(c.name, v1, c.arch))
			rpmArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64", "all": "noarch"}[c.arch]
			q := run(t, "", "rpm", "-qp", "--qf", "%{NAME} %{VERSION} %{RELEASE} %{ARCH}\n%{LICENSE}\n%{PACKAGER}\n", rpm)
			lines := strings.Split(q, "\n")
			if lines[0] != c.name+" "+v1+" 1 "+rpmArch || !strings.Contains(lines[1], "LicenseRef-Proprietary") || !strings.Contains(lines[2], "@") {
				t.Errorf("%s: %q", filepath.Base(rpm), q)
			}
			if got := strings.TrimSpace(run(t, "", "rpm", "-qp", "--conflicts", rpm)); got != c.conflicts {
				t.Errorf("%s: conflicts %q, want %q", filepath.Base(rpm), got, c.conflicts)
			}
			if got := strings.TrimSpace(run(t, "", "rpm", "-qp", "--configfiles", rpm)); got != c.conffile {
				t.Errorf("%s: config files %q, want %q", filepath.Base(rpm), got, c.conffile)
			}
			if c.conffile != "" {
				// %config(noreplace): an edited file is kept on an upgrade.
				if got := strings.TrimSpace(run(t, "", "rpm", "-qp", "--qf", `[%{FILEFLAGS:fflags} %{FILENAMES}\n]`, rpm)); !strings.Contains(got, "cn "+c.conffile) {
					t.Errorf("%s: %s is not %%config(noreplace):\n%s", filepath.Base(rpm), c.conffile, got)
				}
			}
			var requires []string
			for _, r := range strings.Split(strings.TrimSpace(run(t, "", "rpm", "-qp", "--requires", rpm)), "\n") {
				if r != "" && !strings.HasPrefix(r, "rpmlib(") { // rpm's own format features
					requires = append(requires, r)
				}
			}
			if got := strings.Join(requires, " "); got != c.requires {
				t.Errorf("%s: requires %q, want %q", filepath.Base(rpm), got, c.requires)
			}
		}
	}
}

// controlFile is one member of deb's control archive.
func controlFile(t *testing.T, deb, name string) string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader([]byte(run(t, "", "dpkg-deb", "--ctrl-tarfile", deb))))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s has no %s in its control archive", deb, name)
		}
		if h.Name == name {
			var b bytes.Buffer
			b.ReadFrom(tr)
			return b.String()
		}
	}
}

func controlMembers(t *testing.T, deb string) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader([]byte(run(t, "", "dpkg-deb", "--ctrl-tarfile", deb))))
	var out []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Typeflag == tar.TypeReg {
			out = append(out, h.Name)
		}
	}
	return out
}

// TestBinaries: each package holds the binary built for its architecture
// (the arm64 packages an AArch64 ELF), byte for byte.
func TestBinaries(t *testing.T) {
	need(t, "dpkg", "dpkg")
	need(t, "rpm", "rpm")
	built(t)
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, arch := range []string{"amd64", "arm64"} {
		for _, c := range []struct{ pkg, bin, path string }{
			{"bcd-node", "bcd-node", "/usr/bin/bcd"},
			{"bcd-node", "bcd-helper", "/usr/libexec/bcd/bcd-helper"},
			{"bcd-site", "bcd-site", "/usr/bin/bcd"},
			{"bcgw", "bcgw", "/usr/bin/bcgw"},
		} {
			bin := filepath.Join(fx.bin1, arch, c.bin)
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			if f.Machine != machine[arch] {
				t.Errorf("%s is %v, want %v", bin, f.Machine, machine[arch])
			}
			f.Close()
			want := sha256File(t, bin)

			dir := t.TempDir()
			run(t, "", "dpkg-deb", "-x", filepath.Join(fx.pkgs1, debName(c.pkg, v1, arch)), dir)
			if got := sha256File(t, filepath.Join(dir, c.path)); got != want {
				t.Errorf("%s %s: %s is not %s", c.pkg, arch, c.path, bin)
			}
			digests := run(t, "", "rpm", "-qp", "--qf", `[%{FILEDIGESTS} %{FILENAMES}\n]`, filepath.Join(fx.pkgs1, rpmName(c.pkg, v1, arch)))
			if !strings.Contains(digests, want+" "+c.path+"\n") {
				t.Errorf("%s %s rpm: %s is not %s:\n%s", c.pkg, arch, c.path, bin, digests)
			}
		}
	}
	// bcd version of the package's own binary names its version.
	if out := run(t, "", filepath.Join(fx.bin1, "amd64", "bcd-node"), "version"); !strings.HasPrefix(out, "bcd "+v1+" (node) linux/amd64") {
		t.Errorf("bcd version: %q", out)
	}
}

// TestLintian: lintian reports no errors on any .deb (and, today, no
// warnings either: they are logged).
func TestLintian(t *testing.T) {
	need(t, "lintian", "lintian")
	built(t)
	debs, err := filepath.Glob(filepath.Join(fx.pkgs1, "*.deb"))
	if err != nil || len(debs) != 8 {
		t.Fatalf("%d .debs (%v), want 8", len(debs), err)
	}
	debs = append(debs, filepath.Join(fx.pkgs2, debName("bcd-node", v2, "amd64")))
	cmd := exec.Command("lintian", append([]string{"--display-level", ">=warning", "--fail-on", "error"}, debs...)...)
	out, err := cmd.CombinedOutput()
	t.Logf("lintian:\n%s", out)
	if err != nil {
		t.Errorf("lintian: %v", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "E: ") {
			t.Errorf("lintian error: %s", l)
		}
	}
}

// TestMaintainerScripts: every maintainer script of every package parses
// as POSIX sh and is shellcheck-clean; so are install.sh, packages.sh and
// bcd-account.
func TestMaintainerScripts(t *testing.T) {
	need(t, "dpkg", "dpkg")
	need(t, "rpm", "rpm")
	need(t, "shellcheck", "shellcheck")
	built(t)
	dir := t.TempDir()
	var scripts []string
	for _, name := range []string{"bcd-node", "bcd-site", "bcgw"} {
		ctrl := filepath.Join(dir, name+"-deb")
		run(t, "", "dpkg-deb", "-e", filepath.Join(fx.pkgs1, debName(name, v1, "amd64")), ctrl)
		for _, s := range []string{"postinst", "prerm", "postrm"} {
			scripts = append(scripts, filepath.Join(ctrl, s))
		}
		rpm := filepath.Join(fx.pkgs1, rpmName(name, v1, "amd64"))
		for _, tag := range []string{"POSTIN", "PREUN", "POSTUN"} {
			body := run(t, "", "rpm", "-qp", "--qf", "%{"+tag+"}", rpm)
			if !strings.HasPrefix(body, "#!/bin/sh\n") {
				t.Errorf("%s %%{%s}: %q", filepath.Base(rpm), tag, body)
				continue
			}
			p := filepath.Join(dir, name+"-rpm-"+tag)
			if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
			scripts = append(scripts, p)
		}
	}
	for _, s := range scripts {
		run(t, "", "sh", "-n", s)
	}
	run(t, "", "shellcheck", append([]string{"--shell=sh"}, scripts...)...)
	root := repo(t)
	run(t, "", "shellcheck", filepath.Join(root, "build", "install.sh"), filepath.Join(root, "build", "packages.sh"), filepath.Join(root, "build", "pkg", "files", "bcd-account"))
}

// TestSizes: packages.sh ends with each package's size next to its
// binaries'.
func TestSizes(t *testing.T) {
	built(t)
	t.Logf("packages.sh:\n%s", fx.sizes)
	for _, arch := range []string{"amd64", "arm64"} {
		for _, c := range []struct{ file, holds string }{
			{debName("bcd-node", v1, arch), arch + "/bcd-node+" + arch + "/bcd-helper"},
			{rpmName("bcd-node", v1, arch), arch + "/bcd-node+" + arch + "/bcd-helper"},
			{debName("bcd-site", v1, arch), arch + "/bcd-site"},
			{rpmName("bcd-site", v1, arch), arch + "/bcd-site"},
			{debName("bcgw", v1, arch), arch + "/bcgw"},
			{rpmName("bcgw", v1, arch), arch + "/bcgw"},
		} {
			st, err := os.Stat(filepath.Join(fx.pkgs1, c.file))
			if err != nil {
				t.Fatal(err)
			}
			var bins int64
			for _, b := range strings.Split(c.holds, "+") {
				bst, err := os.Stat(filepath.Join(fx.bin1, b))
				if err != nil {
					t.Fatal(err)
				}
				bins += bst.Size()
			}
			re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(c.file) + ` +` + strconv.FormatInt(st.Size(), 10) + ` +` + regexp.QuoteMeta(c.holds) + ` +` + strconv.FormatInt(bins, 10) + `$`)
			if !re.MatchString(fx.sizes) {
				t.Errorf("no line for %s: its size %d, then %s, %d", c.file, st.Size(), c.holds, bins)
			}
		}
	}
}

// TestBuilderUnit runs build/pkg's own vet and tests (its own module, so
// the root's go test ./... does not reach it).
func TestBuilderUnit(t *testing.T) {
	for _, args := range [][]string{{"vet", "./..."}, {"test", "-count=1", "./..."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = filepath.Join(repo(t), "build", "pkg")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("go %v in build/pkg: %v\n%s", args, err, out)
		}
	}
}

// TestUnitsVerify: systemd-analyze verify passes every unit (and the
// unprivileged drop-in) with no warning, on the host, each ExecStart
// pointed at the binary built for this machine. The debootstrap test
// verifies them again as installed.
func TestUnitsVerify(t *testing.T) {
	need(t, "systemd-analyze", "systemd")
	built(t)
	src := filepath.Join(repo(t), "build", "systemd")
	dir := t.TempDir()
	bin := filepath.Join(fx.bin1, "amd64")
	for unit, binary := range map[string]string{
		"bcd.service": "bcd-node", "bcd-join.service": "bcd-node", "bcd-site.service": "bcd-site", "bcd-helper.service": "bcd-helper",
		"bcd-rollback@.service": "bcd-node", "bcgw.service": "bcgw", "bcgw@.service": "bcgw",
	} {
		data, err := os.ReadFile(filepath.Join(src, unit))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.NewReplacer("ExecStart=/usr/bin/bcd ", "ExecStart="+filepath.Join(bin, binary)+" ",
			"ExecStart=/usr/bin/bcgw ", "ExecStart="+filepath.Join(bin, binary)+" ",
			"ExecCondition=/usr/bin/bcd ", "ExecCondition="+filepath.Join(bin, binary)+" ",
			"ExecStart=/usr/libexec/bcd/bcd-helper ", "ExecStart="+filepath.Join(bin, binary)+" ").Replace(string(data))
		if s == string(data) {
			t.Fatalf("%s: no ExecStart to point at %s", unit, binary)
		}
		if err := os.WriteFile(filepath.Join(dir, unit), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dropin, err := os.ReadFile(filepath.Join(src, "bcd.service.d", "10-unprivileged.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bcd.service.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bcd.service.d", "10-unprivileged.conf"), dropin, 0o644); err != nil {
		t.Fatal(err)
	}
	units, _ := filepath.Glob(filepath.Join(dir, "*.service"))
	// A template is verified as an instance of it.
	for i, u := range units {
		if strings.HasSuffix(u, "@.service") {
			units[i] = strings.TrimSuffix(u, "@.service") + "@bcd.service.service"
		}
	}
	out, errOut, err := runErr("", "systemd-analyze", append([]string{"verify"}, units...)...)
	if err != nil || strings.TrimSpace(out+errOut) != "" {
		t.Errorf("systemd-analyze verify: %v\n%s%s", err, out, errOut)
	}
}
