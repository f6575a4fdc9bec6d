package tpm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestDeviceTransport: a command is one write and its response one read,
// as on /dev/tpmrm0 (a SOCK_SEQPACKET pair keeps the boundaries a TPM
// device keeps); a path that is not a device is refused.
func TestDeviceTransport(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET, 0)
	if err != nil {
		t.Fatal(err)
	}
	dev, tpmEnd := os.NewFile(uintptr(fds[0]), "dev"), os.NewFile(uintptr(fds[1]), "tpm")
	defer tpmEnd.Close()
	rsp := response(stNoSessions, 0)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, 4096)
		n, _ := tpmEnd.Read(b)
		got <- b[:n]
		tpmEnd.Write(rsp)
	}()
	tr := &deviceTransport{f: dev}
	defer tr.Close()
	cmd := flushContextCmd(0x80000001)
	answer, err := tr.Send(cmd)
	if err != nil || !bytes.Equal(answer, rsp) {
		t.Fatalf("Send = %x, %v; want %x", answer, err, rsp)
	}
	if c := <-got; !bytes.Equal(c, cmd) {
		t.Fatalf("the device read %x, want %x", c, cmd)
	}
	if _, _, err := parseResponse(answer, 0, 0); err != nil {
		t.Fatal(err)
	}

	file := filepath.Join(t.TempDir(), "tpmrm0")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(file); err == nil || !strings.Contains(err.Error(), "is not a device") {
		t.Errorf("Open(a regular file) = %v, want not a device", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "absent")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(a missing path) = %v, want not exist", err)
	}
}
