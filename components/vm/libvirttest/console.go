package libvirttest

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Console is what a domain printed on its serial console since the test
// began reading it.
type Console struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	opened  time.Time
	changed chan struct{}
}

// ReadConsole reads the serial console of domain name from the moment it
// runs: it waits for the domain to run, opens its pty (virsh ttyconsole)
// as root in raw mode, and keeps what it prints until t ends. QEMU drops
// what a pty prints while no one has it open, so what came before the
// open is lost.
func (d *Daemon) ReadConsole(t *testing.T, name string) *Console {
	t.Helper()
	c := &Console{changed: make(chan struct{})}
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		var f *os.File
		for f == nil {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			out, err := d.run(t.Context(), "ttyconsole", name)
			path := strings.TrimSpace(out)
			if err != nil || !strings.HasPrefix(path, "/dev/pts/") {
				continue
			}
			if f, err = openRaw(path); err != nil {
				c.append([]byte(fmt.Sprintf("[libvirttest: open %s: %v]\n", path, err)))
				f = nil
			}
		}
		c.mu.Lock()
		c.opened = time.Now()
		c.mu.Unlock()
		go func() { <-done; f.Close() }()
		b := make([]byte, 4096)
		for {
			n, err := f.Read(b)
			if n > 0 {
				c.append(b[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return c
}

// openRaw opens a pty's follower side without making it a controlling
// terminal, in raw mode so nothing read is echoed back into the guest.
func openRaw(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	tio, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("TCGETS %s: %w", path, err)
	}
	tio.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	tio.Oflag &^= unix.OPOST
	tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	tio.Cflag &^= unix.CSIZE | unix.PARENB
	tio.Cflag |= unix.CS8
	tio.Cc[unix.VMIN], tio.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(int(f.Fd()), unix.TCSETS, tio); err != nil {
		f.Close()
		return nil, fmt.Errorf("TCSETS %s: %w", path, err)
	}
	return f, nil
}

func (c *Console) append(b []byte) {
	c.mu.Lock()
	c.buf.Write(b)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// String is everything read so far.
func (c *Console) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// Opened is when the console was opened (zero: not yet).
func (c *Console) Opened() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opened
}

// Wait waits until the console has printed text, for at most timeout,
// and says whether it did.
func (c *Console) Wait(text string, timeout time.Duration) bool {
	end := time.After(timeout)
	for {
		c.mu.Lock()
		found, changed := bytes.Contains(c.buf.Bytes(), []byte(text)), c.changed
		c.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-changed:
		case <-end:
			return false
		}
	}
}
