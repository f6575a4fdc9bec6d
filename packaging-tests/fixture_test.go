package packagingtests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The versions the tests build: v1 for every architecture and format, v2
// (amd64 only) to upgrade to.
const (
	v1 = "1.0.0"
	v2 = "1.0.1"
	// sourceDateEpoch fixes every file's time: the builds are reproducible.
	sourceDateEpoch = "1767225600" // 2026-01-01
)

// fx holds what the package's tests share: the packages, built once.
var fx struct {
	once  sync.Once
	err   error
	dir   string // removed by TestMain
	bin1  string // BIN/ARCH/bcd-* of v1
	bin2  string
	pkgs1 string // v1's packages
	pkgs2 string
	sizes string // packages.sh's table for v1
	took  time.Duration
}

func TestMain(m *testing.M) {
	start := time.Now()
	code := m.Run()
	if fx.dir != "" {
		os.RemoveAll(fx.dir)
	}
	fmt.Printf("packaging-tests: %s in all (building the packages: %s)\n", time.Since(start).Round(time.Second), fx.took.Round(time.Second))
	os.Exit(code)
}

// repo is the repository's root.
func repo(t testing.TB) string {
	t.Helper()
	p, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// need fails (or, when not root, skips) a test that needs a tool the
// machine lacks: CI runs as root with every tool installed.
func need(t testing.TB, tool, debianPackage string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err == nil {
		return
	}
	if os.Geteuid() != 0 {
		testenv.Skip(t, "%s is missing and this is not root to install it (apt-get install %s)", tool, debianPackage)
	}
	t.Fatalf("%s is missing: apt-get install %s (build/deps.sh should)", tool, debianPackage)
}

// built returns the directory holding the v1 packages, building them (and
// v2's) on first use.
func built(t testing.TB) {
	t.Helper()
	fx.once.Do(func() {
		start := time.Now()
		defer func() { fx.took = time.Since(start) }()
		fx.dir, fx.err = os.MkdirTemp("", "bcd-packaging-")
		if fx.err != nil {
			return
		}
		images := filepath.Join(fx.dir, "images")
		if fx.err = placeholderRamdisk(images); fx.err != nil {
			return
		}
		if fx.err = placeholderRamdisk(filepath.Join(images, "arm64")); fx.err != nil {
			return
		}
		fx.bin1, fx.pkgs1 = filepath.Join(fx.dir, "bin1"), filepath.Join(fx.dir, "v1")
		fx.bin2, fx.pkgs2 = filepath.Join(fx.dir, "bin2"), filepath.Join(fx.dir, "v2")
		root := repo(t)
		if fx.sizes, fx.err = packagesSh(root, "VERSION="+v1, "BIN_DIR="+fx.bin1, "PKG_DIR="+fx.pkgs1, "IMAGES_DIR="+images); fx.err != nil {
			return
		}
		_, fx.err = packagesSh(root, "VERSION="+v2, "ARCHES=amd64", "BIN_DIR="+fx.bin2, "PKG_DIR="+fx.pkgs2, "IMAGES_DIR="+filepath.Join(fx.dir, "none"))
	})
	if fx.err != nil {
		t.Fatal(fx.err)
	}
}

// packagesSh runs build/packages.sh with env added and returns its stdout
// (the sizes table).
func packagesSh(root string, env ...string) (string, error) {
	cmd := exec.Command(filepath.Join(root, "build", "packages.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), append([]string{"SOURCE_DATE_EPOCH=" + sourceDateEpoch}, env...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build/packages.sh %v: %v\n%s%s", env, err, out.String(), errOut.String())
	}
	return out.String(), nil
}

// placeholderRamdisk writes stand-ins for images/out's artifacts (only
// tests use them) with their digests in sha256sum's format.
func placeholderRamdisk(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []string{"vmlinuz", "initramfs.cpio.zst", "ramdisk.ipxe"} {
		data := []byte("placeholder " + f + " for the package tests\n")
		if f == "vmlinuz" {
			// The builder checks an amd64 kernel is a bzImage (HdrS at
			// 0x202); the arm64 one goes unchecked.
			data = make([]byte, 1024)
			copy(data[0x202:], "HdrS")
		}
		sum := sha256.Sum256(data)
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f+".sha256"), []byte(hex.EncodeToString(sum[:])+"  "+f+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// debName and rpmName are the builder's file names (nfpm's conventions).
func debName(name, version, arch string) string {
	return fmt.Sprintf("%s_%s_%s.deb", name, version, arch)
}

func rpmName(name, version, arch string) string {
	rpmArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64", "all": "noarch"}[arch]
	return fmt.Sprintf("%s-%s-1.%s.rpm", name, version, rpmArch)
}

// run runs a command and returns its stdout, failing the test with both
// outputs when it fails.
func run(t testing.TB, stdin string, name string, args ...string) string {
	t.Helper()
	out, errOut, err := runErr(stdin, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// runErr runs a command with a plain PATH (the chroot's as much as the
// host's) and returns both outputs.
func runErr(stdin string, name string, args ...string) (string, string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C")
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

func sha256File(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
