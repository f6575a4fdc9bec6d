//go:build linux

package xid

import (
	"context"
	"errors"
	"github.com/better-compute/bcd/components/base/testenv"
	"io/fs"
	"strings"
	"testing"
	"time"
)

// TestReadKmsgDevice reads the real /dev/kmsg where the test may; it must
// end (the device is non-blocking) and fail only for want of access.
func TestReadKmsgDevice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := ReadKmsg(ctx)
	switch {
	case errors.Is(err, fs.ErrPermission):
		if !strings.Contains(err.Error(), "CAP_SYSLOG") {
			t.Errorf("permission error does not say what is needed: %v", err)
		}
		testenv.Skip(t, "no access to the kernel log: %v", err)
	case errors.Is(err, fs.ErrNotExist):
		testenv.Skip(t, "no kernel log device: %v", err)
	case err != nil:
		t.Fatal(err)
	}
}

func TestReadKmsgCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := ReadKmsg(ctx)
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, fs.ErrPermission) && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadKmsg with a canceled context: %v", err)
	}
}
