package libvirtrt

import (
	"context"
	"errors"
	"os"

	"github.com/better-compute/bcd/components/helper/wire"
)

// Console opens the serial console of running domain id, one bcd owns:
// bcd helper opens its pty as root (libvirt.console, by id alone) and
// passes the descriptor back; the node never opens a path itself.
func (r *Runtime) Console(ctx context.Context, id string) (*os.File, error) {
	resp, err := r.cfg.Helper.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpLibvirtConsole, ID: id})
	if err != nil {
		return nil, err
	}
	if resp.File == nil {
		return nil, errors.New("bcd helper answered libvirt.console without the console")
	}
	return resp.File, nil
}
