package packagingtests

import (
	"bufio"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The clean Debian root the install tests use: debootstrap's minbase
// variant of bookworm plus systemd (so systemctl enable,
// deb-systemd-helper and systemd-analyze exist as on a real host), made
// once a day from the machine's configured mirror and cached; each test
// run copies it.
const (
	suite    = "bookworm"
	rootKind = suite + "-minbase-systemd"
)

// cacheDir holds the cached roots, one per day (BCD_DEBOOTSTRAP_CACHE
// overrides it).
func cacheDir() string {
	if d := os.Getenv("BCD_DEBOOTSTRAP_CACHE"); d != "" {
		return d
	}
	return "/var/cache/bcd-test-debootstrap"
}

// debianRoot returns a fresh copy of the cached root in a test directory.
// It skips, loudly, only where debootstrap cannot run: not root, or no
// mirror to reach and no cached root from an earlier day.
func debianRoot(t *testing.T) string {
	t.Helper()
	testenv.NeedRoot(t, "debootstrap and chroot")
	need(t, "debootstrap", "debootstrap")
	need(t, "chroot", "coreutils")
	start := time.Now()
	cached, err := cachedRoot(t)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command("cp", "-a", cached, dir).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v\n%s", cached, dir, err, out)
	}
	t.Logf("Debian root: a copy of %s (%s)", cached, time.Since(start).Round(100*time.Millisecond))
	return dir
}

// cachedRoot returns today's cached root, making it when missing. Another
// process making it at the same time waits on the lock.
func cachedRoot(t *testing.T) (string, error) {
	base := cacheDir()
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(base, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("flock %s: %w", lock.Name(), err)
	}
	today := rootKind + "-" + time.Now().UTC().Format("20060102")
	root := filepath.Join(base, today, "root")
	if _, err := os.Stat(filepath.Join(base, today, "ok")); err == nil {
		return root, nil
	}

	mirror := configuredMirror()
	if err := reachable(mirror); err != nil {
		if older := newestCached(base); older != "" {
			t.Logf("NOTE: %s is not reachable (%v): using the cached root of an earlier day, %s", mirror, err, older)
			return older, nil
		}
		testenv.Skip(t, "debootstrap cannot run here: the Debian mirror %s is not reachable (%v) and %s holds no cached root", mirror, err, base)
	}

	tmp := filepath.Join(base, today+".tmp")
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	start := time.Now()
	cmd := exec.Command("debootstrap", "--variant=minbase", "--include=systemd", suite, filepath.Join(tmp, "root"), mirror)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(tmp)
		tail := string(out)
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		return "", fmt.Errorf("debootstrap --variant=minbase --include=systemd %s %s: %v\n%s", suite, mirror, err, tail)
	}
	if err := os.WriteFile(filepath.Join(tmp, "ok"), []byte(mirror+"\n"), 0o644); err != nil {
		return "", err
	}
	os.RemoveAll(filepath.Join(base, today))
	if err := os.Rename(tmp, filepath.Join(base, today)); err != nil {
		return "", err
	}
	t.Logf("debootstrap %s from %s: %s, cached in %s", suite, mirror, time.Since(start).Round(time.Second), filepath.Join(base, today))
	// Earlier days' roots are not needed any more.
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), rootKind+"-") && e.Name() != today {
			os.RemoveAll(filepath.Join(base, e.Name()))
		}
	}
	return root, nil
}

// newestCached is the root of the latest day cached, or "".
func newestCached(base string) string {
	entries, _ := os.ReadDir(base)
	var days []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(base, e.Name(), "ok")); err == nil && strings.HasPrefix(e.Name(), rootKind+"-") {
			days = append(days, e.Name())
		}
	}
	if len(days) == 0 {
		return ""
	}
	sort.Strings(days)
	return filepath.Join(base, days[len(days)-1], "root")
}

// configuredMirror is the first Debian archive apt's sources name for the
// suite (one-line or deb822 format), else deb.debian.org.
func configuredMirror() string {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	lists, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	for _, f := range append(append([]string{"/etc/apt/sources.list"}, files...), lists...) {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.HasSuffix(f, ".sources") {
			for _, stanza := range strings.Split(string(data), "\n\n") {
				fields := map[string]string{}
				for _, l := range strings.Split(stanza, "\n") {
					if k, v, ok := strings.Cut(l, ":"); ok && !strings.HasPrefix(l, "#") {
						fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
					}
				}
				if hasWord(fields["types"], "deb") && hasWord(fields["suites"], suite) && hasWord(fields["components"], "main") {
					for _, u := range strings.Fields(fields["uris"]) {
						if strings.HasPrefix(u, "http") {
							return strings.TrimSuffix(u, "/")
						}
					}
				}
			}
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(string(data)))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			// deb [options] URI SUITE COMPONENT...
			if len(f) < 4 || f[0] != "deb" {
				continue
			}
			i := 1
			if strings.HasPrefix(f[1], "[") {
				for i < len(f) && !strings.HasSuffix(f[i], "]") {
					i++
				}
				i++
			}
			if i+2 < len(f) && strings.HasPrefix(f[i], "http") && f[i+1] == suite && hasWord(strings.Join(f[i+2:], " "), "main") {
				return strings.TrimSuffix(f[i], "/")
			}
		}
	}
	return "http://deb.debian.org/debian"
}

func hasWord(list, w string) bool {
	for _, f := range strings.Fields(list) {
		if f == w {
			return true
		}
	}
	return false
}

// reachable asks the mirror for the suite's Release file.
func reachable(mirror string) error {
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Head(mirror + "/dists/" + suite + "/Release")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HEAD %s/dists/%s/Release: %s", mirror, suite, resp.Status)
	}
	return nil
}
