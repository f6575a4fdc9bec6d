// Command pkg builds bcd's packages with nfpm as a library: bcd-node,
// bcd-site, bcgw and, when images/out holds a ramdisk, bcd-ramdisk-image-ARCH,
// each as a .deb and an .rpm, for every architecture asked for. It lives
// in its own module (build/pkg/go.mod) so that nfpm's dependencies never
// enter the daemon's. build/packages.sh cross-compiles the binaries and
// runs it; docs/packages.md says what each package holds and why.
//
//	cd build/pkg && go run . --version 1.2.3 --bin ../../bin --out ../../bin/packages
package main

import (
	"bytes"
	"compress/gzip"
	"embed"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
)

//go:embed maintainer/*.tmpl
var maintainerFS embed.FS

type options struct {
	rawVersion string
	version    string // the package version (packageVersion)
	arches     []string
	formats    []string
	bin        string // BIN/ARCH/bcd-{node,site,helper} and BIN/ARCH/bcgw
	images     string // the ramdisk artifacts (images/out)
	out        string
	systemd    string // build/systemd
	build      string // build/
	self       string // build/pkg
	maintainer string
	license    string
	homepage   string
	commit     string
	mtime      time.Time
	tmp        string
}

// A built package, for the sizes table.
type built struct {
	path     string
	size     int64
	binaries []string
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "build/pkg:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	o := &options{}
	flags := flag.NewFlagSet("pkg", flag.ContinueOnError)
	flags.StringVar(&o.rawVersion, "version", os.Getenv("VERSION"), "the version the binaries were built with (v1.2.3, git describe output, 0.1.0-dev)")
	arches := flags.String("arch", "amd64,arm64", "architectures, comma-separated")
	formats := flags.String("formats", "deb,rpm", "package formats, comma-separated")
	flags.StringVar(&o.bin, "bin", "../../bin", "directory holding ARCH/bcd-node, ARCH/bcd-site, ARCH/bcd-helper and ARCH/bcgw")
	flags.StringVar(&o.images, "images", "../../images/out", "the ramdisk artifacts: vmlinuz, initramfs.cpio.zst, ramdisk.ipxe and their .sha256 (amd64 here or in amd64/, others in ARCH/)")
	flags.StringVar(&o.out, "out", "../../bin/packages", "where the packages are written")
	flags.StringVar(&o.systemd, "systemd", "../systemd", "the systemd units")
	flags.StringVar(&o.maintainer, "maintainer", "Better Compute <bcd@better-compute.dev>", "the packages' maintainer")
	flags.StringVar(&o.license, "license", "LicenseRef-Proprietary", "the license field (SPDX)")
	flags.StringVar(&o.homepage, "homepage", "https://github.com/better-compute/bcd", "the homepage field")
	flags.StringVar(&o.commit, "commit", "", "the commit the binaries were built from, for the changelog")
	mtime := flags.Int64("mtime", 0, "modification time of every file, in Unix seconds (default SOURCE_DATE_EPOCH, else now)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() != 0 {
		return fmt.Errorf("takes no arguments, got %q", flags.Args())
	}
	if o.rawVersion == "" {
		return fmt.Errorf("--version (or VERSION) is required")
	}
	var err error
	if o.version, err = packageVersion(o.rawVersion); err != nil {
		return err
	}
	o.arches = splitList(*arches)
	o.formats = splitList(*formats)
	for _, a := range o.arches {
		if a != "amd64" && a != "arm64" {
			return fmt.Errorf("--arch %s: only amd64 and arm64", a)
		}
	}
	for _, f := range o.formats {
		if _, ok := unitDirs[f]; !ok {
			return fmt.Errorf("--formats %s: only deb and rpm", f)
		}
	}
	o.mtime = time.Now().UTC().Truncate(time.Second)
	if *mtime != 0 {
		o.mtime = time.Unix(*mtime, 0).UTC()
	} else if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		o.mtime = time.Unix(n, 0).UTC()
	}
	if o.self, err = os.Getwd(); err != nil {
		return err
	}
	o.build = filepath.Dir(o.self)
	for _, p := range []*string{&o.bin, &o.images, &o.out, &o.systemd} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if o.tmp, err = os.MkdirTemp("", "bcd-pkg-"); err != nil {
		return err
	}
	defer os.RemoveAll(o.tmp)

	var specs []spec
	for _, arch := range o.arches {
		specs = append(specs, nodeSpec(o, arch), siteSpec(o, arch), gatewaySpec(o, arch))
		s, ok, why, err := ramdiskSpec(o, arch)
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintf(os.Stderr, "build/pkg: skipping bcd-ramdisk-image-%s: %s\n", arch, why)
			continue
		}
		specs = append(specs, s)
	}
	type job struct {
		s      spec
		format string
	}
	var jobs []job
	for _, s := range specs {
		for _, b := range s.Binaries {
			if _, err := os.Stat(b); err != nil {
				return missingBinary(b)
			}
		}
		for _, format := range o.formats {
			jobs = append(jobs, job{s, format})
		}
	}
	// Compressing is most of the time: one package per CPU at once.
	all := make([]built, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			all[i], errs[i] = buildOne(o, j.s, j.format)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%s (%s, %s): %w", j.s.Name, j.s.Arch, j.format, errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	printSizes(os.Stdout, all)
	return nil
}

// buildOne writes one package into o.out under its format's conventional
// file name.
func buildOne(o *options, s spec, format string) (built, error) {
	info := &nfpm.Info{
		Name:          s.Name,
		Arch:          s.Arch,
		Platform:      "linux",
		Version:       o.version,
		VersionSchema: "none",
		Section:       "admin",
		Priority:      "optional",
		Maintainer:    o.maintainer,
		Description:   s.Summary + "\n" + wrap(s.Description, 72),
		Vendor:        "Better Compute",
		Homepage:      o.homepage,
		License:       s.License,
		MTime:         o.mtime,
	}
	info.Conflicts = s.Conflicts
	info.Depends = s.Depends[format]
	info.Umask = 0o022
	info.Deb.Compression = "xz"
	info.RPM.Compression = "xz"
	info.RPM.Summary = s.Summary
	info.RPM.Group = "System Environment/Daemons"
	info.RPM.Packager = o.maintainer
	info.RPM.BuildHost = "bcd-build" // not this machine's name: reproducible
	if format == "rpm" {
		// RPM has its summary apart; its description is only the body.
		info.Description = wrap(s.Description, 72)
	}

	for _, e := range s.Files {
		c := &files.Content{Destination: e.Dst, Source: e.Src, FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: e.Mode, MTime: o.mtime}}
		switch {
		case e.Src == "":
			c.Type = files.TypeDir
		case e.Conf:
			c.Type = files.TypeConfigNoReplace
		case e.Unit:
			c.Destination = unitDirs[format] + "/" + e.Dst
		}
		info.Contents = append(info.Contents, c)
	}
	if s.Man != "" {
		page, err := gzipFile(o, filepath.Join(o.build, "man", s.Man))
		if err != nil {
			return built{}, err
		}
		info.Contents = append(info.Contents, &files.Content{
			Source: page, Destination: "/usr/share/man/man1/" + s.Man + ".gz",
			FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: 0o644, MTime: o.mtime},
		})
	}
	if format == "deb" {
		// Debian wants a copyright file and, for a native package, a
		// changelog in /usr/share/doc/NAME; RPM carries both as headers.
		docs, err := debDocs(o, s)
		if err != nil {
			return built{}, err
		}
		info.Contents = append(info.Contents, docs...)
	}
	if s.Scripts != nil {
		if err := scripts(o, s, format, info); err != nil {
			return built{}, err
		}
	}

	info = nfpm.WithDefaults(info)
	if err := nfpm.Validate(info); err != nil {
		return built{}, err
	}
	packager, err := nfpm.Get(format)
	if err != nil {
		return built{}, err
	}
	name := packager.ConventionalFileName(info)
	path := filepath.Join(o.out, name)
	tmp, err := os.CreateTemp(o.out, ".tmp-"+name)
	if err != nil {
		return built{}, err
	}
	defer os.Remove(tmp.Name())
	if err := packager.Package(info, tmp); err != nil {
		tmp.Close()
		return built{}, err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return built{}, err
	}
	if err := tmp.Close(); err != nil {
		return built{}, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return built{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return built{}, err
	}
	return built{path: path, size: st.Size(), binaries: s.Binaries}, nil
}

// scripts renders the maintainer scripts of s for format into o.tmp.
func scripts(o *options, s spec, format string, info *nfpm.Info) error {
	names := map[string]*string{
		"deb-postinst": &info.Scripts.PostInstall, "deb-prerm": &info.Scripts.PreRemove, "deb-postrm": &info.Scripts.PostRemove,
		"rpm-post": &info.Scripts.PostInstall, "rpm-preun": &info.Scripts.PreRemove, "rpm-postun": &info.Scripts.PostRemove,
	}
	for name, field := range names {
		if !strings.HasPrefix(name, format+"-") {
			continue
		}
		t, err := template.ParseFS(maintainerFS, "maintainer/"+name+".tmpl")
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, s.Scripts); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		path := filepath.Join(o.tmp, s.Name+"-"+s.Arch+"-"+name)
		if err := os.WriteFile(path, buf.Bytes(), 0o755); err != nil {
			return err
		}
		*field = path
	}
	return nil
}

// debDocs writes s's copyright file and changelog.gz into o.tmp and
// returns them as contents.
func debDocs(o *options, s spec) ([]*files.Content, error) {
	dir := filepath.Join(o.tmp, s.Name+"-"+s.Arch+"-doc")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	copyright := "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n" +
		"Upstream-Name: bcd\n" +
		"Source: " + o.homepage + "\n\n" +
		"Files: *\n" +
		"Copyright: " + strconv.Itoa(o.mtime.Year()) + " Better Compute\n" +
		"License: " + o.license + "\n" +
		" Licensed to Better Compute's customers; not for redistribution.\n"
	if strings.HasPrefix(s.Name, "bcd-ramdisk-image-") {
		copyright += "\nFiles: usr/share/bcd/ramdisk/*/vmlinuz\n" +
			"Copyright: Linus Torvalds and others\n" +
			"License: GPL-2.0-only\n" +
			" The Linux kernel of Debian's linux-image package. On Debian systems the\n" +
			" full text of the license is in /usr/share/common-licenses/GPL-2.\n" +
			"\nFiles: usr/share/bcd/ramdisk/*/initramfs.cpio.zst\n" +
			"Copyright: The u-root Authors; Better Compute\n" +
			"License: BSD-3-Clause AND " + o.license + "\n" +
			" u-root's commands (BSD-3-Clause, see https://github.com/u-root/u-root)\n" +
			" and bcd ramdisk.\n"
	}
	what := "Built"
	if o.commit != "" {
		what = "Built from commit " + o.commit
	}
	changelog := fmt.Sprintf("%s (%s) unstable; urgency=medium\n\n  * %s; the changes are in\n    %s.\n\n -- %s  %s\n",
		s.Name, o.version, what, o.homepage, o.maintainer, o.mtime.Format("Mon, 02 Jan 2006 15:04:05 -0700"))
	if err := os.WriteFile(filepath.Join(dir, "copyright"), []byte(copyright), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "changelog"), []byte(changelog), 0o644); err != nil {
		return nil, err
	}
	gz, err := gzipFile(o, filepath.Join(dir, "changelog"))
	if err != nil {
		return nil, err
	}
	docs := map[string]string{
		"/usr/share/doc/" + s.Name + "/copyright":    filepath.Join(dir, "copyright"),
		"/usr/share/doc/" + s.Name + "/changelog.gz": gz,
	}
	if len(s.StaticELF) > 0 {
		// bcd's binaries are static by design (one minimal static binary
		// per role); lintian exempts Go only when a Debian source package
		// build-depends on golang-go, which these packages have none of.
		text := "# bcd is Go, built CGO_ENABLED=0: statically linked by design.\n"
		for _, p := range s.StaticELF {
			text += s.Name + ": statically-linked-binary [" + strings.TrimPrefix(p, "/") + "]\n"
		}
		path := filepath.Join(dir, "lintian-overrides")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return nil, err
		}
		docs["/usr/share/lintian/overrides/"+s.Name] = path
	}
	var out []*files.Content
	for dst, src := range docs {
		out = append(out, &files.Content{
			Source: src, Destination: dst,
			FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: 0o644, MTime: o.mtime},
		})
	}
	return out, nil
}

// gzipFile writes path, gzipped at the best level with no name or time in
// the header (reproducible), into o.tmp and returns the new file's path.
func gzipFile(o *options, path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var gz bytes.Buffer
	w, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return "", err
	}
	if _, err := w.Write(data); err != nil {
		return "", err
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(o.tmp, filepath.Base(path)+"-*.gz")
	if err != nil {
		return "", err
	}
	if _, err := f.Write(gz.Bytes()); err != nil {
		f.Close()
		return "", err
	}
	return f.Name(), f.Close()
}

// wrap fills each paragraph of text (paragraphs are separated by a blank
// line) to lines of at most width characters.
func wrap(text string, width int) string {
	var paras []string
	for _, p := range strings.Split(text, "\n\n") {
		var lines []string
		line := ""
		for _, w := range strings.Fields(p) {
			if line != "" && len(line)+1+len(w) > width {
				lines = append(lines, line)
				line = ""
			}
			if line != "" {
				line += " "
			}
			line += w
		}
		if line != "" {
			lines = append(lines, line)
		}
		paras = append(paras, strings.Join(lines, "\n"))
	}
	return strings.Join(paras, "\n\n")
}

// printSizes prints each package's size next to its binaries' (or the
// ramdisk's artifacts').
func printSizes(w *os.File, all []built) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "package\tbytes\tholds\tbytes")
	for _, b := range all {
		var names []string
		var total int64
		for _, bin := range b.binaries {
			names = append(names, filepath.Base(filepath.Dir(bin))+"/"+filepath.Base(bin))
			if st, err := os.Stat(bin); err == nil {
				total += st.Size()
			}
		}
		fmt.Fprintf(tw, "%s\t%9d\t%s\t%9d\n", filepath.Base(b.path), b.size, strings.Join(names, "+"), total)
	}
	tw.Flush()
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		out = append(out, f)
	}
	return out
}
