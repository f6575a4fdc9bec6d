package rootvirt

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/components/helper"
	"github.com/better-compute/bcd/components/vm/domainxml"
)

// IdentityFile is the identity disk of an instance restored from memory,
// in its directory: a fresh SSH host key the node wrote, which the guest
// takes from the disk attached as vdz (docs/instances.md, "Identity
// rebind").
const IdentityFile = "identity.iso"

// attachIdentity hot-adds the instance's identity disk to its running
// (or paused) domain as vdz, read-only and raw (never probed), after the
// checks every disk gets: a regular file of the node's uid with one link,
// reached with no symlink on the way. The disk's XML is root's, from the
// id alone; a domain that already has a vdz keeps it.
func attachIdentity(ctx context.Context, h helper.LibvirtHost, id string) error {
	out, err := h.Virsh(ctx, nil, "domstate", id)
	if err != nil {
		return err
	}
	if st := strings.TrimSpace(string(out)); st != "running" && st != "paused" {
		return refuse("attach-disk %s: the domain is %s; the identity disk goes to a running domain", id, st)
	}
	path := filepath.Join(h.DataDir, "instances", id, IdentityFile)
	if _, err := checkFile(path, h.Owner, nil); err != nil {
		return err
	}
	list, err := h.Virsh(ctx, nil, "domblklist", id)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(list), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "vdz" {
			return nil
		}
	}
	host := domainxml.Host{InstancesDir: h.DataDir + "/instances"}
	disk, err := domainxml.IdentityDisk(host, id, IdentityFile)
	if err != nil {
		return refuse("attach-disk %s: %v", id, err)
	}
	if _, err := h.Virsh(ctx, disk, "attach-device", id, "/dev/stdin", "--live"); err != nil {
		return fmt.Errorf("attach-disk %s: %w", id, err)
	}
	return nil
}
