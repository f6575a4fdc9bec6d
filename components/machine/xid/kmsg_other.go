//go:build !linux

package xid

import (
	"context"
	"errors"
	"fmt"
	"runtime"
)

// KmsgPath is the kernel's log device.
const KmsgPath = "/dev/kmsg"

// ReadKmsg is Linux's; elsewhere it fails with errors.ErrUnsupported.
func ReadKmsg(ctx context.Context) ([]Event, error) {
	return nil, fmt.Errorf("reading %s on %s: %w", KmsgPath, runtime.GOOS, errors.ErrUnsupported)
}
