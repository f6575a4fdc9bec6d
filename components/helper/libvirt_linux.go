//go:build linux

package helper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// libvirtMu runs one libvirt.* operation at a time: a define checks the
// domain it replaces, then defines; nothing may come in between.
var libvirtMu sync.Mutex

// errNoVirsh is virsh missing from the system directories.
var errNoVirsh = errors.New("virsh is not installed on this host (looked in /usr/sbin, /sbin, /usr/bin and /bin; libvirt-clients)")

// libvirt is the libvirt.* operations. libvirt.define takes the
// instances section only from a signed spec, as access.apply does: the
// proof and the section go through Admit under root's own anchors, and
// the instances' root half renders the domain from the section root
// verified. The others act only on a domain bcd's metadata names.
func (srv *server) libvirt(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	if srv.cfg.Libvirt == nil {
		return refused(fmt.Errorf("%s: this helper runs no instances", req.Op))
	}
	h, err := srv.libvirtHost()
	if err != nil {
		return refused(fmt.Errorf("%s: %w", req.Op, err))
	}
	libvirtMu.Lock()
	defer libvirtMu.Unlock()
	if req.Op == wire.OpLibvirtConsole {
		f, final, err := srv.cfg.Libvirt.Console(ctx, h, req.ID)
		if err != nil {
			return libvirtAnswer(err, final)
		}
		srv.log.Info("helper: libvirt.console", "instance", req.ID, "tty", f.Name())
		return &wire.Response{OK: true, Console: true, File: f}, "ok"
	}
	if req.Op != wire.OpLibvirtDefine && req.Op != wire.OpLibvirtRestore {
		final, err := srv.cfg.Libvirt.Act(ctx, h, req.Op, req.ID)
		return libvirtAnswer(err, final)
	}
	proof, err := rootsig.DecodeProof(req.Proof)
	if err != nil {
		return refused(fmt.Errorf("%s: %w", req.Op, err))
	}
	anchors, err := srv.anchors()
	if err != nil {
		return refused(fmt.Errorf("%s: %w", req.Op, err))
	}
	commit, err := anchors.Admit(proof, "instances", req.Section)
	if err != nil {
		return refused(fmt.Errorf("%s refused: %w", req.Op, err))
	}
	// Admitted: the proof's node is the one root is bound to (or binds
	// to on first use).
	h.Node = proof.NodeID
	do := srv.cfg.Libvirt.Define
	if req.Op == wire.OpLibvirtRestore {
		do = srv.cfg.Libvirt.Restore
	}
	final, err := do(ctx, h, req.ID, req.Section)
	if err != nil {
		return libvirtAnswer(err, final)
	}
	if err := commit(); err != nil {
		return failed(fmt.Errorf("%s: %w", req.Op, err), true)
	}
	srv.log.Info("helper: "+req.Op, "instance", req.ID, "accel", h.Accel, "generation", proof.Generation)
	return ok()
}

func libvirtAnswer(err error, final bool) (*wire.Response, string) {
	switch {
	case err == nil:
		return ok()
	case final:
		return refused(err)
	default:
		return failed(err, true)
	}
}

// libvirtHost is what root knows for a libvirt.* operation: the node's
// data_dir and uid, the node its join record binds it to, the
// acceleration root's [instances] accel allows, virsh on root's
// libvirtd, and the host's GPUs.
func (srv *server) libvirtHost() (LibvirtHost, error) {
	dataDir := srv.cfg.Update.DataDir
	if dataDir == "" {
		return LibvirtHost{}, errors.New("root's configuration names no data_dir")
	}
	node := ""
	if a, err := srv.anchors(); err == nil {
		node = a.NodeID()
	}
	uri := srv.cfg.Instances.LibvirtURI(false)
	return LibvirtHost{DataDir: dataDir, Owner: srv.uid, Staging: filepath.Join(srv.cfg.StateDir, "libvirt-save"), Accel: srv.cfg.Instances.Accelerator(), Node: node,
		Virsh: func(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
			return runVirsh(ctx, uri, stdin, args...)
		},
		GPUs: srv.gpuAddresses, Guarded: srv.tapGuarded}, nil
}

// runVirsh runs virsh -q -c uri with args and the fixed environment. A
// failure carries virsh's standard error, cut to 1 KiB.
func runVirsh(ctx context.Context, uri string, stdin []byte, args ...string) ([]byte, error) {
	p, err := findTool("virsh")
	if err != nil {
		return nil, errNoVirsh
	}
	cmd := exec.CommandContext(ctx, p, append([]string{"-q", "-c", uri}, args...)...)
	cmd.Env = toolEnv
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 1024 {
			msg = msg[:1024] + "..."
		}
		return stdout.Bytes(), fmt.Errorf("virsh %s: %w: %s", args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// gpuAddresses lists this host's GPUs with their PCI bus ids from
// nvidia-smi; a fakehw build's fake GPUs have none, so none can be
// passed through.
func (srv *server) gpuAddresses(ctx context.Context) (map[string]string, error) {
	if srv.s.fakeHW {
		return nil, nil
	}
	out, err := srv.s.smi(ctx, "--query-gpu=uuid,pci.bus_id", "--format=csv,noheader")
	if errors.Is(err, errNoSMI) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	gpus := map[string]string{}
	for _, line := range bytes.Split(out, []byte("\n")) {
		uuid, bus, found := strings.Cut(string(line), ",")
		uuid, bus = strings.TrimSpace(uuid), strings.TrimSpace(bus)
		if uuid == "" && !found {
			continue
		}
		if !wire.IsGPUUUID(uuid) || len(gpus) == maxGPUs {
			return nil, fmt.Errorf("nvidia-smi printed %q where a GPU UUID and its PCI bus id belong", short(string(line)))
		}
		gpus[uuid] = bus
	}
	return gpus, nil
}
