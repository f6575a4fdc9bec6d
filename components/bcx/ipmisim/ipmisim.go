// Package ipmisim runs OpenIPMI's ipmi_sim as a test BMC: a LAN channel
// with one admin user, FRU 0 (product manufacturer, name and serial), a
// system GUID, one temperature sensor, and chassis control (power and
// the boot device) through a shell script whose power commands a test
// chooses (a file by default; a QEMU VM in the QEMU tier). Test code only:
// no role may link it.
package ipmisim

import (
	"bytes"
	"context"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Options configure the simulated BMC.
type Options struct {
	// Addr is the LAN address (IP:port) to listen on; default a free port
	// on 127.0.0.1.
	Addr string
	// Username and Password of the admin user (defaults admin and a fixed
	// test password).
	Username, Password string
	// SerialPort, when set, adds the VM serial interface (channel 15) on
	// 127.0.0.1:SerialPort for QEMU's ipmi-bmc-extern.
	SerialPort int
	// PowerOn, PowerOff and PowerStatus are shell commands run by the
	// chassis control script (in its directory); PowerStatus exits 0 when
	// the machine is on. Defaults: a file named "on".
	PowerOn, PowerOff, PowerStatus string
	// Command wraps how ipmi_sim and the test's own ipmitool are started
	// (e.g. inside a network namespace): it gets the argv and returns the
	// command.
	Command func(argv ...string) *exec.Cmd
}

// Identity of the simulated machine, as FRU 0 and the GUID say.
const (
	Manufacturer = "Better Compute"
	Model        = "QEMU IPMI VM"
	Serial       = "SN-IPMI-0001"
	// GUIDBytes is the system GUID ipmi_sim holds; ipmitool shows it as
	// UUID.
	GUIDBytes = "0123456789abcdef"
	UUID      = "efcdab89-6745-23a1-efcd-ab89674523a1"
	// SensorName is the temperature sensor in the SDR.
	SensorName = "BCTemp"
)

// BMC is a running ipmi_sim.
type BMC struct {
	Addr, Host, Port   string
	Username, Password string
	Dir                string
	cmd                *exec.Cmd
	out                *syncBuf
	wrap               func(argv ...string) *exec.Cmd
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Need skips the test loudly (fails it under CI=true) without ipmi_sim and
// ipmitool.
func Need(t testing.TB) {
	t.Helper()
	testenv.NeedTool(t, "ipmi_sim", "openipmi")
	testenv.NeedTool(t, "ipmitool", "ipmitool")
}

func freeUDP(t testing.TB) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

// Start starts ipmi_sim and waits until its LAN channel answers.
func Start(t testing.TB, o Options) *BMC {
	t.Helper()
	Need(t)
	if o.Addr == "" {
		o.Addr = freeUDP(t)
	}
	if o.Username == "" {
		o.Username = "admin"
	}
	if o.Password == "" {
		o.Password = "ipmi-Test-pw1"
	}
	if o.PowerOn == "" {
		o.PowerOn, o.PowerOff, o.PowerStatus = "touch on", "rm -f on", "test -f on"
	}
	host, port, err := net.SplitHostPort(o.Addr)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "ipmisim-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := &BMC{Addr: o.Addr, Host: host, Port: port, Username: o.Username, Password: o.Password, Dir: dir, out: &syncBuf{}, wrap: o.Command}
	script := filepath.Join(dir, "chassis.sh")
	write(t, script, chassisScript(o), 0o755)
	var lan strings.Builder
	fmt.Fprintf(&lan, "name \"bcdtest\"\nset_working_mc 0x20\n  startlan 1\n    addr %s %s\n    priv_limit admin\n", host, port)
	for _, p := range []string{"callback", "user", "operator", "admin"} {
		fmt.Fprintf(&lan, "    allowed_auths_%s md5 straight\n", p)
	}
	fmt.Fprintf(&lan, "    guid a123456789abcdefa123456789abcdef\n  endlan\n")
	if o.SerialPort != 0 {
		fmt.Fprintf(&lan, "  serial 15 127.0.0.1 %d codec VM\n", o.SerialPort)
	}
	fmt.Fprintf(&lan, "  chassis_control \"%s 0x20\"\n", script)
	fmt.Fprintf(&lan, "  user 2 true %q %q admin 10 md5 straight\n", o.Username, o.Password)
	write(t, filepath.Join(dir, "lan.conf"), lan.String(), 0o600)
	write(t, filepath.Join(dir, "bmc.emu"), emu(), 0o600)
	os.Mkdir(filepath.Join(dir, "state"), 0o700)
	argv := []string{"ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "bmc.emu"),
		"-s", filepath.Join(dir, "state"), "-n", "-p"}
	if o.Command != nil {
		b.cmd = o.Command(argv...)
	} else {
		b.cmd = exec.Command(argv[0], argv[1:]...)
	}
	b.cmd.Dir = dir
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.out
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("start ipmi_sim: %v", err)
	}
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
		_ = exec.Command("sh", "-c", "cd "+dir+" && ("+o.PowerOff+")").Run()
	})
	end := time.Now().Add(20 * time.Second)
	for {
		if _, err := b.Ipmitool(context.Background(), "chassis", "power", "status"); err == nil {
			return b
		} else if time.Now().After(end) {
			t.Fatalf("ipmi_sim did not answer on %s: %v\n%s", o.Addr, err, b.out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Ipmitool runs ipmitool against the BMC as the test's own observer
// (cipher suite 3, which ipmi_sim supports; password from a file).
func (b *BMC) Ipmitool(ctx context.Context, args ...string) (string, error) {
	pw := filepath.Join(b.Dir, "observer.pw")
	if err := os.WriteFile(pw, []byte(b.Password+"\n"), 0o600); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	argv := append([]string{"-I", "lanplus", "-C", "3", "-H", b.Host, "-p", b.Port, "-U", b.Username, "-f", pw, "-N", "1", "-R", "2"}, args...)
	cmd := exec.CommandContext(ctx, "ipmitool", argv...)
	if b.wrap != nil {
		cmd = b.wrap(append([]string{"ipmitool"}, argv...)...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ipmitool %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Output is what ipmi_sim printed.
func (b *BMC) Output() string { return b.out.String() }

// Boot is the boot device the chassis control script was last given
// (none, pxe, default, cdrom, bios), "" when never set.
func (b *BMC) Boot() string {
	v, _ := os.ReadFile(filepath.Join(b.Dir, "boot"))
	return strings.TrimSpace(string(v))
}

func write(t testing.TB, p, s string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), mode); err != nil {
		t.Fatal(err)
	}
}

// chassisScript is ipmi_sim's chassis_control program: "MC get PARM..."
// prints PARM:VALUE lines, "MC set PARM VALUE..." sets them.
func chassisScript(o Options) string {
	return `#!/bin/sh
cd "$(dirname "$0")" || exit 1
shift
op=$1
shift
case $op in
get)
	for p in "$@"; do
		case $p in
		power) if ` + o.PowerStatus + ` >/dev/null 2>&1; then echo power:1; else echo power:0; fi ;;
		boot) if [ -f boot ]; then echo "boot:$(cat boot)"; else echo boot:default; fi ;;
		*) echo "unknown parameter $p"; exit 1 ;;
		esac
	done ;;
set)
	while [ $# -ge 2 ]; do
		case $1 in
		power) if [ "$2" = 1 ]; then (` + o.PowerOn + `) >>power.log 2>&1 || exit 1; else (` + o.PowerOff + `) >>power.log 2>&1 || exit 1; fi ;;
		boot) echo "$2" > boot ;;
		esac
		shift 2
	done ;;
*) exit 1 ;;
esac
`
}

// emu is the BMC's emulator commands: the MC, its GUID, FRU 0 and one
// temperature sensor with its SDR.
func emu() string {
	var b strings.Builder
	b.WriteString("mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nsel_enable 0x20 50 0x0a\n")
	fmt.Fprintf(&b, "mc_set_guid 0x20 %q\n", GUIDBytes)
	b.WriteString("sensor_add 0x20 0 1 0x01 0x01\n")
	// A full sensor record (type 01) for sensor 1 on LUN 0: temperature,
	// degrees C, its name last.
	sdr := []byte{0x00, 0x00, 0x51, 0x01, 0x00, 0x20, 0x00, 0x01, 0x03, 0x01, 0x67, 0x88, 0x01, 0x01, 0xc0, 0x0f, 0xc0, 0x7f,
		0x38, 0x38, 0x00, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x60, 0xb0, 0x00, 0xb0, 0x00, 0xa0,
		0x90, 0x70, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0 | byte(len(SensorName))}
	sdr = append(sdr, SensorName...)
	sdr[4] = byte(len(sdr) - 5)
	b.WriteString("main_sdr_add 0x20" + hexBytes(sdr) + "\n")
	b.WriteString("sensor_set_value 0x20 0 1 0x60 0\n")
	b.WriteString("sensor_set_event_support 0x20 0 1 enable scanning per-state 000111111000000 000111111000000 000111111000000 000111111000000\n")
	f := fru()
	fmt.Fprintf(&b, "mc_add_fru_data 0x20 0 %d data%s\n", len(f), hexBytes(f))
	b.WriteString("mc_enable 0x20\n")
	return b.String()
}

func hexBytes(b []byte) string {
	var s strings.Builder
	for _, c := range b {
		fmt.Fprintf(&s, " 0x%02x", c)
	}
	return s.String()
}

// fru builds FRU data (IPMI Platform Management FRU Information Storage
// Definition v1.0) with a common header and a product info area.
func fru() []byte {
	area := []byte{0x01, 0x00, 0x19} // version, length (set below), English
	for _, s := range []string{Manufacturer, Model, "BC-1", "1.0", Serial, "", ""} {
		area = append(area, 0xc0|byte(len(s)))
		area = append(area, s...)
	}
	area = append(area, 0xc1) // end of fields
	for (len(area)+1)%8 != 0 {
		area = append(area, 0)
	}
	area[1] = byte((len(area) + 1) / 8)
	area = append(area, checksum(area))
	hdr := []byte{0x01, 0, 0, 0, 0x01, 0, 0} // product area at offset 8
	hdr = append(hdr, checksum(hdr))
	return append(hdr, area...)
}

func checksum(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return -s
}
