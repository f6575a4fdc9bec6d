// Package initramfs builds the bcd ramdisk's initramfs with u-root's
// builder (github.com/u-root/mkuimage/uimage): u-root's init as /init, our
// uinit (initramfs/cmd/ramdisk-init) as /bin/uinit, the ramdisk role binary
// as /bin/bcd, and the kernel modules the ramdisk needs with their
// dependencies (components/disk/kmod), compressed with zstd.
//
// The build has two layers. The base holds u-root's init, which mkuimage
// compiles with `go build -a` (slow, and the same for a given u-root
// version and Go toolchain), so it is cached under a key of both. The top
// layer (our two binaries, the modules and their index) is merged onto the
// base on every build, in about a second.
package initramfs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/disk/kmod"
	"github.com/klauspost/compress/zstd"
	"github.com/u-root/gobusybox/src/pkg/golang"
	"github.com/u-root/mkuimage/cpio"
	"github.com/u-root/mkuimage/uimage"
	"github.com/u-root/mkuimage/uimage/initramfs"
	"github.com/u-root/uio/llog"
)

// UrootInit is the init command the image runs as /init.
const UrootInit = "github.com/u-root/u-root/cmds/core/init"

// The packages of our two binaries.
const (
	RolePackage = "./roles/ramdisk"
	InitPackage = "./initramfs/cmd/ramdisk-init"
)

// DefaultCABundle is Debian's bundle of the public CAs (ca-certificates).
const DefaultCABundle = "/etc/ssl/certs/ca-certificates.crt"

// caBundlePath is where the image holds it.
const caBundlePath = "etc/ssl/certs/ca-certificates.crt"

// ErrGoModLacksInit is returned when go.mod and go.sum do not cover the
// packages u-root's init imports (mkuimage builds it in this module).
var ErrGoModLacksInit = errors.New("go.mod lacks what u-root's init (" + UrootInit + ") needs")

// baseFormat changes whenever what buildBase puts in the base changes, so
// a cached base from an older recipe is not reused.
const baseFormat = "bcd-ramdisk-base-1"

// DefaultModules are the modules the ramdisk always loads, whatever the
// machine: the TPM interfaces (built into Debian's kernel, so nothing to
// copy there; listed for a kernel that has them as modules), ext4
// (deploy.image mounts an installed OS's partition to configure it, and
// boot.kexec reads its kernel from there) and sd_mod (the disks behind
// any SATA, SAS or SCSI controller, which appear asynchronously after
// the controller's driver loads). The hardware drivers are DefaultDrivers,
// loaded only for the devices present. Dependencies and softdeps come
// from the kernel's own modules.dep and modules.softdep.
var DefaultModules = []string{"tpm_tis", "tpm_crb", "ext4", "sd_mod"}

// Config is one build.
type Config struct {
	Repo          string   // the bcd module root (holds go.mod)
	KernelRelease string   // whose modules to copy
	ModulesRoot   string   // default /lib/modules
	Modules       []string // loaded at every boot; default DefaultModules
	// Drivers are carried and loaded only when a device's modalias
	// matches one of their aliases; nil: DefaultDrivers' names.
	Drivers []string
	// FirmwareRoot is where the firmware files the modules ask for are
	// copied from: /lib/firmware when "".
	FirmwareRoot string
	// BCD is a built ramdisk role binary to put in the image; empty builds
	// RolePackage with LDFlags.
	BCD     string
	LDFlags string // default "-s -w"
	Output  string // the .cpio.zst to write
	// RolePackage and InitPackage are the bcd role built as bin/bcd and
	// the uinit built as bin/ramdisk-init (the name the base layer runs);
	// default the ramdisk's. The test installed OS (images/osimage) puts
	// the node role and initramfs/cmd/os-init there.
	RolePackage, InitPackage string
	// CABundle is the PEM file of CA certificates put at
	// etc/ssl/certs/ca-certificates.crt (where Go looks on Linux), so
	// deploy.image can fetch an image from its https source URL; default
	// DefaultCABundle when it exists, "-" for none.
	CABundle string
	// CacheDir holds cached base layers; empty disables the cache.
	CacheDir string
	Log      io.Writer // progress lines; nil discards
}

// Result describes what was built.
type Result struct {
	Output   string
	Size     int64 // compressed bytes
	CPIOSize int64 // uncompressed archive bytes
	Plan     kmod.Plan
	// Firmware lists the firmware files copied; FirmwareMissing those the
	// modules ask for that the build machine does not have, by module.
	Firmware        []string
	FirmwareMissing map[string][]string
	BaseCached      bool
	Sizes           map[string]int64 // bytes of bin/init, bin/ramdisk-init, bin/bcd and lib/modules
	Took            time.Duration
}

// Build writes cfg.Output.
func Build(ctx context.Context, cfg Config) (*Result, error) {
	start := time.Now()
	if cfg.ModulesRoot == "" {
		cfg.ModulesRoot = "/lib/modules"
	}
	if cfg.Modules == nil {
		cfg.Modules = DefaultModules
	}
	if cfg.Drivers == nil {
		cfg.Drivers = DriverNames(DefaultDrivers)
	}
	if cfg.FirmwareRoot == "" {
		cfg.FirmwareRoot = "/lib/firmware"
	}
	if cfg.LDFlags == "" {
		cfg.LDFlags = "-s -w"
	}
	if cfg.RolePackage == "" {
		cfg.RolePackage = RolePackage
	}
	if cfg.InitPackage == "" {
		cfg.InitPackage = InitPackage
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.KernelRelease == "" {
		return nil, errors.New("initramfs: no kernel release")
	}
	repo, err := filepath.Abs(cfg.Repo)
	if err != nil {
		return nil, err
	}
	cfg.Repo = repo
	logf := func(format string, a ...any) { fmt.Fprintf(cfg.Log, "initramfs: "+format+"\n", a...) }

	tmp, err := os.MkdirTemp("", "bcd-initramfs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	res := &Result{Output: cfg.Output, Sizes: map[string]int64{}}

	// The base: u-root's init, cached.
	key, err := baseKey(ctx, cfg.Repo)
	if err != nil {
		return nil, err
	}
	base := filepath.Join(tmp, "base.cpio")
	if cfg.CacheDir != "" {
		base = filepath.Join(cfg.CacheDir, "base-"+key+".cpio")
	}
	if _, err := os.Stat(base); err == nil {
		res.BaseCached = true
		logf("base layer (u-root init) from %s", base)
	} else {
		t := time.Now()
		if err := buildBase(cfg.Repo, tmp, base); err != nil {
			return nil, err
		}
		logf("built the base layer (u-root init) in %.1fs", time.Since(t).Seconds())
	}

	// The top layer, staged as a directory tree.
	stage := filepath.Join(tmp, "stage")
	bin := filepath.Join(stage, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(stage, 0o755); err != nil {
		return nil, err
	}
	t := time.Now()
	if err := goBuild(ctx, cfg.Repo, "-s -w", cfg.InitPackage, filepath.Join(bin, "ramdisk-init")); err != nil {
		return nil, err
	}
	if cfg.BCD == "" {
		if err := goBuild(ctx, cfg.Repo, cfg.LDFlags, cfg.RolePackage, filepath.Join(bin, "bcd")); err != nil {
			return nil, err
		}
	} else if err := CopyFile(cfg.BCD, filepath.Join(bin, "bcd"), 0o755); err != nil {
		return nil, err
	}
	logf("built bin/ramdisk-init and bin/bcd in %.1fs", time.Since(t).Seconds())

	switch bundle := cfg.CABundle; {
	case bundle == "-":
	case bundle == "" && !exists(DefaultCABundle):
		logf("no CA bundle (%s missing: apt-get install ca-certificates): deploy.image cannot fetch from https URLs", DefaultCABundle)
	default:
		if bundle == "" {
			bundle = DefaultCABundle
		}
		if err := os.MkdirAll(filepath.Join(stage, filepath.Dir(caBundlePath)), 0o755); err != nil {
			return nil, err
		}
		if err := CopyFile(bundle, filepath.Join(stage, caBundlePath), 0o644); err != nil {
			return nil, fmt.Errorf("initramfs: CA bundle: %w", err)
		}
		for _, d := range []string{"etc/ssl/certs", "etc/ssl"} {
			if err := os.Chmod(filepath.Join(stage, d), 0o755); err != nil {
				return nil, err
			}
		}
		if st, err := os.Stat(filepath.Join(stage, caBundlePath)); err == nil {
			res.Sizes[caBundlePath] = st.Size()
		}
	}

	plan, modBytes, err := stageModules(cfg, stage)
	if err != nil {
		return nil, err
	}
	res.Plan = plan
	res.Sizes["lib/modules"] = modBytes
	logf("%d modules for %s: %s (built in: %s)", len(plan.Modules), cfg.KernelRelease,
		strings.Join(plan.Names(), " "), strings.Join(plan.Builtin, " "))
	fw, fwBytes, err := stageFirmware(cfg, stage, plan)
	if err != nil {
		return nil, err
	}
	res.Firmware, res.FirmwareMissing, res.Sizes["lib/firmware"] = fw.copied, fw.missing, fwBytes
	logf("firmware: %d files (%d bytes) copied from %s", len(fw.copied), fwBytes, cfg.FirmwareRoot)
	for _, m := range slices.Sorted(maps.Keys(fw.missing)) {
		logf("firmware: %s asks for %s, not on this machine (Debian's non-free-firmware packages ship most)", m, strings.Join(fw.missing[m], ", "))
	}
	for _, f := range []string{"ramdisk-init", "bcd"} {
		if st, err := os.Stat(filepath.Join(bin, f)); err == nil {
			res.Sizes["bin/"+f] = st.Size()
		}
	}
	if sz, err := recordSize(base, "bin/init"); err == nil {
		res.Sizes["bin/init"] = sz
	}

	// Merge the top layer onto the base, straight into zstd.
	out := &zstdCPIO{path: cfg.Output}
	err = uimage.Create(logger(cfg.Log),
		uimage.WithBaseFile(base),
		uimage.WithExistingInit(true),
		// stage is the archive's "." record too, replacing the base's
		// (the builder's 0700 temp dir): the root must be 0755.
		uimage.WithFiles(stage+":."),
		uimage.WithSkipLDD(),
		uimage.WithTempDir(tmp),
		uimage.WithOutput(out),
	)
	if err != nil {
		return nil, fmt.Errorf("initramfs: merging the top layer: %w", err)
	}
	st, err := os.Stat(cfg.Output)
	if err != nil {
		return nil, err
	}
	res.Size, res.CPIOSize = st.Size(), out.raw
	res.Took = time.Since(start)
	logf("wrote %s: %d bytes (cpio %d bytes) in %.1fs", cfg.Output, res.Size, res.CPIOSize, res.Took.Seconds())
	return res, nil
}

func logger(w io.Writer) *llog.Logger {
	return llog.New(slog.LevelWarn, func(format string, v ...any) {
		fmt.Fprintf(w, "initramfs: uimage: "+format+"\n", v...)
	})
}

// baseRecords are the directories and device nodes the kernel and u-root's
// init need before devtmpfs is mounted: /dev/console must exist in the
// archive or init starts with no console. (uimage.DefaultRamfs would also
// add a resolv.conf naming a public resolver, which the ramdisk must not
// use.)
func baseRecords() []cpio.Record {
	return []cpio.Record{
		cpio.Directory("bin", 0o755),
		cpio.Directory("dev", 0o755),
		cpio.Directory("etc", 0o755),
		cpio.Directory("lib", 0o755),
		cpio.Directory("proc", 0o555),
		cpio.Directory("run", 0o755),
		cpio.Directory("sys", 0o555),
		cpio.Directory("tmp", 0o1777),
		cpio.Directory("usr", 0o755),
		cpio.Directory("var", 0o755),
		cpio.CharDev("dev/console", 0o600, 5, 1),
		cpio.CharDev("dev/null", 0o666, 1, 3),
		cpio.CharDev("dev/tty", 0o666, 5, 0),
		cpio.CharDev("dev/urandom", 0o444, 1, 9),
	}
}

func buildEnv(repo string) *golang.Environ {
	return golang.Default(golang.DisableCGO(), golang.WithGOOS("linux"), golang.WithGOARCH("amd64"), golang.WithWorkingDir(repo))
}

// buildBase writes the base layer: u-root's init (as /init) with /bin/uinit
// pointing at our ramdisk-init.
func buildBase(repo, tmp, out string) error {
	records, err := cpio.ArchiveFromRecords(baseRecords())
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(tmp, "base")
	if err != nil {
		return err
	}
	part := out + ".part"
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	err = uimage.Create(logger(io.Discard),
		uimage.WithReplaceEnv(buildEnv(repo)),
		uimage.WithBaseArchive(records),
		uimage.WithBinaryCommands(UrootInit),
		uimage.WithInit("init"),
		uimage.WithUinit("/bin/ramdisk-init"),
		uimage.WithSkipLDD(),
		uimage.WithTempDir(dir),
		uimage.WithCPIOOutput(part),
	)
	if err != nil {
		os.Remove(part)
		return fmt.Errorf("initramfs: building the base layer (u-root init) with mkuimage: %w", err)
	}
	return os.Rename(part, out)
}

// baseKey names a base layer by everything that goes into u-root's init:
// the versions of every module it links, the Go toolchain and the recipe.
func baseKey(ctx context.Context, repo string) (string, error) {
	list := exec.CommandContext(ctx, "go", "list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}@{{.Version}}{{end}}", UrootInit)
	list.Dir = repo
	list.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	var stderr strings.Builder
	list.Stderr = &stderr
	deps, err := list.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "missing go.sum entry") || strings.Contains(msg, "no required module") {
			return "", fmt.Errorf("initramfs: %w; run `go get %s@<the u-root version in go.mod>`: %s", ErrGoModLacksInit, UrootInit, msg)
		}
		return "", fmt.Errorf("initramfs: go list -deps %s: %v: %s", UrootInit, err, msg)
	}
	ver, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("initramfs: go env GOVERSION: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s", baseFormat, strings.TrimSpace(string(ver)), deps)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// goBuild builds one of our packages, static, for the image.
func goBuild(ctx context.Context, repo, ldflags, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initramfs: go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// stageModules copies the plan's modules and a matching index to
// stage/lib/modules/<release>, and the list the init loads to
// stage/etc/bcd-ramdisk/modules.
func stageModules(cfg Config, stage string) (kmod.Plan, int64, error) {
	src := filepath.Join(cfg.ModulesRoot, cfg.KernelRelease)
	ix, err := kmod.ReadIndex(src)
	if err != nil {
		return kmod.Plan{}, 0, fmt.Errorf("initramfs: %w", err)
	}
	plan, err := ix.Resolve(append(slices.Clone(cfg.Modules), cfg.Drivers...)...)
	if err != nil {
		return kmod.Plan{}, 0, fmt.Errorf("initramfs: %w", err)
	}
	dst := filepath.Join(stage, "lib", "modules", cfg.KernelRelease)
	var total int64
	for _, m := range plan.Modules {
		to := filepath.Join(dst, m.Path)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return plan, 0, err
		}
		if err := CopyFile(filepath.Join(src, m.Path), to, 0o644); err != nil {
			return plan, 0, err
		}
		st, _ := os.Stat(to)
		total += st.Size()
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return plan, 0, err
	}
	if err := ix.WriteSubset(dst, plan); err != nil {
		return plan, 0, err
	}
	etc := filepath.Join(stage, "etc", "bcd-ramdisk")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return plan, 0, err
	}
	list := "# Loaded by /bin/ramdisk-init in this order, with their dependencies.\n" + strings.Join(cfg.Modules, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(etc, "modules"), []byte(list), 0o644); err != nil {
		return plan, 0, err
	}
	drivers := "# Loaded by /bin/ramdisk-init when a device's modalias matches their aliases.\n" + strings.Join(cfg.Drivers, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(etc, "drivers"), []byte(drivers), 0o644); err != nil {
		return plan, 0, err
	}
	return plan, total, nil
}

// CopyFile copies src to dst (created or truncated, with mode).
func CopyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("initramfs: copying %s: %w", src, err)
	}
	return out.Close()
}

// recordSize returns the size of one file of a cpio archive.
func recordSize(archive, name string) (int64, error) {
	f, err := os.Open(archive)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	rr := cpio.Newc.Reader(f)
	for {
		r, err := rr.ReadRecord()
		if err != nil {
			return 0, err
		}
		if r.Name == name {
			return int64(r.FileSize), nil
		}
	}
}

// ListArchive returns the names in a (zstd-compressed or plain) cpio
// archive, for tests and `mkramdisk -list`.
func ListArchive(path string) ([]cpio.Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(4); string(magic) == "\x28\xb5\x2f\xfd" {
		d, err := zstd.NewReader(br)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		r = d
	}
	// The newc reader wants an io.ReaderAt; the archive is small.
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(b)))
	if err != nil {
		return nil, err
	}
	slices.SortFunc(recs, func(a, b cpio.Record) int { return strings.Compare(a.Name, b.Name) })
	return recs, nil
}

// zstdCPIO is an initramfs.WriteOpener writing a newc archive through zstd
// to a temp file renamed over path when finished.
type zstdCPIO struct {
	path string
	raw  int64
}

type zstdWriter struct {
	cpio.RecordWriter
	owner *zstdCPIO
	f     *os.File
	buf   *bufio.Writer
	enc   *zstd.Encoder
	count *countWriter
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (z *zstdCPIO) OpenWriter() (initramfs.Writer, error) {
	if err := os.MkdirAll(filepath.Dir(z.path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(z.path), "."+filepath.Base(z.path)+".tmp*")
	if err != nil {
		return nil, err
	}
	buf := bufio.NewWriterSize(f, 1<<20)
	// The kernel's zstd decompressor takes windows up to 128 MiB; the best
	// level uses 8 MiB.
	enc, err := zstd.NewWriter(buf, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	cw := &countWriter{w: enc}
	return &zstdWriter{RecordWriter: cpio.Newc.Writer(cw), owner: z, f: f, buf: buf, enc: enc, count: cw}, nil
}

func (w *zstdWriter) Finish() error {
	err := cpio.WriteTrailer(w)
	if e := w.enc.Close(); err == nil {
		err = e
	}
	if e := w.buf.Flush(); err == nil {
		err = e
	}
	if e := w.f.Chmod(0o644); err == nil {
		err = e
	}
	if e := w.f.Sync(); err == nil {
		err = e
	}
	if e := w.f.Close(); err == nil {
		err = e
	}
	if err == nil {
		err = os.Rename(w.f.Name(), w.owner.path)
	}
	if err != nil {
		os.Remove(w.f.Name())
		return fmt.Errorf("initramfs: writing %s: %w", w.owner.path, err)
	}
	w.owner.raw = w.count.n
	return nil
}

// KernelRelease picks the release to build for: the newest
// bootDir/vmlinuz-<release> that has modulesRoot/<release>/modules.dep.
func KernelRelease(bootDir, modulesRoot string) (string, error) {
	ks, _ := filepath.Glob(filepath.Join(bootDir, "vmlinuz-*"))
	var rels []string
	for _, k := range ks {
		rel := strings.TrimPrefix(filepath.Base(k), "vmlinuz-")
		if _, err := os.Stat(filepath.Join(modulesRoot, rel, "modules.dep")); err == nil {
			rels = append(rels, rel)
		}
	}
	if len(rels) == 0 {
		return "", fmt.Errorf("initramfs: no %s/vmlinuz-* with %s/<release>/modules.dep (apt-get install linux-image-amd64)", bootDir, modulesRoot)
	}
	slices.SortFunc(rels, compareVersions)
	return rels[len(rels)-1], nil
}

// compareVersions orders release strings, comparing digit runs as numbers
// (6.1.0-9 before 6.1.0-10).
func compareVersions(a, b string) int {
	for a != "" && b != "" {
		da, db := digits(a), digits(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := len(na) - len(nb); c != 0 {
				return c
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return int(a[0]) - int(b[0])
		}
		a, b = a[1:], b[1:]
	}
	return len(a) - len(b)
}

func digits(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
