// Package rdinit is the ramdisk's uinit: u-root's init runs it once the
// root file system is set up. It mounts what u-root's init does not (/run),
// loads the kernel modules the image lists with components/disk/kmod, reports
// the disks and network interfaces that appeared and the bc.* boot
// parameters, then runs `bcd ramdisk` on the console. When the agent exits
// (its normal end is a kexec, which never returns) it prints the exit
// status and powers the machine off; a role binary without the ramdisk
// command is reported as such, and the machine powers off too.
//
// Everything it touches is a field of Config, so tests run the whole flow
// against a temp directory with fake exec and power-off.
package rdinit

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/disk/kmod"
)

// Prefix starts every line rdinit prints, so a serial console log can be
// grepped for it.
const Prefix = "bcd-ramdisk: "

// NotBuilt is printed when the role binary has no ramdisk command yet.
const NotBuilt = Prefix + "ramdisk agent not built yet"

// ModulesList is where the image lists the modules to load, one per line.
const ModulesList = "/etc/bcd-ramdisk/modules"

// DriversList is where the image lists its hardware drivers, loaded only
// for the devices present.
const DriversList = "/etc/bcd-ramdisk/drivers"

// Config says where things are; DefaultConfig is the image's layout.
type Config struct {
	Out         io.Writer
	Cmdline     string // /proc/cmdline
	ModulesRoot string // /lib/modules
	Release     string // uname -r
	ModulesList string // ModulesList
	DriversList string // DriversList
	SysBus      string // /sys/bus: the devices whose modalias picks drivers
	SysBlock    string // /sys/class/block
	SysNet      string // /sys/class/net
	BCD         string // /bin/bcd
	// Settle bounds the wait for disks to appear after the modules load;
	// the wait ends earlier once the list has not changed for Quiet.
	Settle, Quiet time.Duration

	// Seams.
	Mount func() []error // mounts what is missing
	Load  func(names []string) ([]kmod.Result, error)
	// Match returns the modules whose device aliases match a modalias
	// (the image's modules.alias); nil: none.
	Match    func(modalias string) []string
	HasAgent func(bcd string) bool // bcd has the ramdisk command
	// RunAgent runs `bcd ramdisk` on the console and returns its exit
	// status when it ends.
	RunAgent func(bcd string, args []string) (int, error)
	PowerOff func() error
	// Network configures the network interfaces (DHCP) and says how.
	Network func() []string

	// An installed OS's init (initramfs/cmd/os-init) runs the same flow
	// with its own prefix, prepares its root file system after the
	// network, and runs other bcd commands: Steps returns them (each run
	// while the previous one exited 0). Nil runs `bcd ramdisk`.
	Prefix  string
	Prepare func(printf func(format string, a ...any)) error
	Steps   func() ([][]string, error)
}

// Run is the uinit. It returns only when power-off failed.
func Run(c Config) error {
	start := time.Now()
	prefix := c.Prefix
	if prefix == "" {
		prefix = Prefix
	}
	p := func(format string, a ...any) { fmt.Fprintf(c.Out, prefix+format+"\n", a...) }
	p("init started (kernel %s)", c.Release)
	if c.Mount != nil {
		for _, err := range c.Mount() {
			p("mount: %v", err)
		}
	}

	names, err := readList(c.ModulesList)
	if err != nil {
		p("modules: %v", err)
	}
	if len(names) > 0 {
		t := time.Now()
		rs, err := c.Load(names)
		p("%s", summary(rs, time.Since(t)))
		for _, r := range rs {
			if r.Err != nil {
				soft := ""
				if r.Soft {
					soft = " (softdep, not needed)"
				}
				p("module %s %s%s: %v", r.Name, r.State, soft, r.Err)
			}
		}
		if err != nil && len(rs) == 0 {
			p("modules: %v", err)
		}
	}

	loadDrivers(c, p)

	disks := settle(c, func() []string { return blockDevices(c.SysBlock) })
	p("block devices: %s", orNone(disks))
	p("network interfaces: %s", orNone(netInterfaces(c.SysNet)))
	if c.Network != nil {
		t := time.Now()
		for _, l := range c.Network() {
			p("network: %s", l)
		}
		p("network configured in %.1fs", time.Since(t).Seconds())
	}

	words, err := BootWords(c.Cmdline)
	if err != nil {
		p("%v", err)
	}
	p("boot parameters: %d bc.* words", len(words))
	for _, w := range words {
		p("%s", w)
	}
	steps, err := [][]string{{"ramdisk"}}, error(nil)
	if c.Prepare != nil {
		if err = c.Prepare(p); err != nil {
			p("prepare: %v", err)
		}
	}
	if err == nil && c.Steps != nil {
		if steps, err = c.Steps(); err != nil {
			p("%v", err)
		}
	}
	switch {
	case err != nil:
	case c.HasAgent(c.BCD):
		for _, args := range steps {
			name := strings.Join(args, " ")
			if len(args) > 0 {
				name = args[0]
			}
			p("starting %s %s (%.1fs after init started)", c.BCD, strings.Join(args, " "), time.Since(start).Seconds())
			code, err := c.RunAgent(c.BCD, args)
			if err != nil {
				p("%s %s: %v", c.BCD, name, err)
				break
			}
			p("%s %s exited with status %d", c.BCD, name, code)
			if code != 0 {
				break
			}
		}
	default:
		fmt.Fprintln(c.Out, NotBuilt)
		if out, err := exec.Command(c.BCD, "version").CombinedOutput(); err == nil {
			p("%s", strings.TrimSpace(string(out)))
		} else {
			p("%s version: %v", c.BCD, err)
		}
	}
	// The agent ends the ramdisk by kexec; when it returns instead, or is
	// not there, the machine stops rather than panic and reboot into
	// the same boot.
	p("powering off")
	return c.PowerOff()
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " ")
}

func summary(rs []kmod.Result, took time.Duration) string {
	var loaded, already []string
	failed := 0
	for _, r := range rs {
		switch r.State {
		case kmod.Loaded:
			loaded = append(loaded, r.Name)
		case kmod.AlreadyLoaded:
			already = append(already, r.Name)
		default:
			failed++
		}
	}
	s := fmt.Sprintf("modules: loaded %d in %.2fs: %s", len(loaded), took.Seconds(), strings.Join(loaded, " "))
	if len(already) > 0 {
		s += "; already loaded: " + strings.Join(already, " ")
	}
	if failed > 0 {
		s += fmt.Sprintf("; %d failed or skipped", failed)
	}
	return s
}

func readList(p string) ([]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		l := strings.TrimSpace(s.Text())
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out, s.Err()
}

// settle polls list until it has not changed for c.Quiet, or c.Settle
// passed.
func settle(c Config, list func() []string) []string {
	deadline := time.Now().Add(c.Settle)
	last := list()
	since := time.Now()
	for time.Now().Before(deadline) && time.Since(since) < c.Quiet {
		time.Sleep(50 * time.Millisecond)
		if cur := list(); !slices.Equal(cur, last) {
			last, since = cur, time.Now()
		}
	}
	return last
}

// blockDevices lists whole disks (no partitions, loop or ram devices) as
// "name (size)".
func blockDevices(sys string) []string {
	ents, _ := os.ReadDir(sys)
	var out []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, "loop") || strings.HasPrefix(n, "ram") {
			continue
		}
		if _, err := os.Stat(filepath.Join(sys, n, "partition")); err == nil {
			continue
		}
		desc := n
		if b, err := os.ReadFile(filepath.Join(sys, n, "size")); err == nil {
			if sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				desc += fmt.Sprintf(" (%d MiB)", sectors*512>>20)
			}
		}
		if ctl := controller(filepath.Join(sys, n, "device")); ctl != "" {
			desc += " [" + ctl + "]"
		}
		out = append(out, desc)
	}
	return out
}

// controller names the PCI device a block device sits behind and its
// driver, "megaraid_sas@0000:00:04.0": the nearest ancestor of dev (a
// sysfs device link) on the pci bus. "" when there is none.
func controller(dev string) string {
	dir, err := filepath.EvalSymlinks(dev)
	if err != nil {
		return ""
	}
	for range 12 {
		sub, err1 := os.Readlink(filepath.Join(dir, "subsystem"))
		drv, err2 := os.Readlink(filepath.Join(dir, "driver"))
		if err1 == nil && err2 == nil && filepath.Base(sub) == "pci" {
			return filepath.Base(drv) + "@" + filepath.Base(dir)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return ""
}

// netInterfaces lists interfaces other than lo as "name (driver)".
func netInterfaces(sys string) []string {
	ents, _ := os.ReadDir(sys)
	var out []string
	for _, e := range ents {
		n := e.Name()
		if n == "lo" {
			continue
		}
		desc := n
		if d, err := os.Readlink(filepath.Join(sys, n, "device", "driver")); err == nil {
			desc += " (" + filepath.Base(d) + ")"
		}
		out = append(out, desc)
	}
	return out
}

// secretParams are the bc.* parameters whose values are never printed.
var secretParams = map[string]bool{"bc.token": true}

// BootWords returns the bc.* words of the kernel command line in path, each
// "bc.name=value", with secret values replaced by their length.
func BootWords(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("boot parameters: %w", err)
	}
	var out []string
	for _, w := range SplitCmdline(string(b)) {
		if !strings.HasPrefix(w, "bc.") {
			continue
		}
		if k, v, ok := strings.Cut(w, "="); ok && secretParams[k] {
			w = fmt.Sprintf("%s=<%d bytes, not shown>", k, len(v))
		}
		out = append(out, w)
	}
	return out, nil
}

// SplitCmdline splits a kernel command line the way the kernel does:
// on spaces, with double quotes grouping (and dropped), so
// `a="b c" d` is [a=b c, d].
func SplitCmdline(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote, have = !inQuote, true
		case !inQuote && (r == ' ' || r == '\t' || r == '\n'):
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}

// HasRamdiskCommand runs `bcd ramdisk -h`: a build with the command prints
// its flags and exits 0; a build without it says so and exits 2.
func HasRamdiskCommand(bcd string) bool {
	return exec.Command(bcd, "ramdisk", "-h").Run() == nil
}
