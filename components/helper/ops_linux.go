//go:build linux

package helper

import (
	"context"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/components/helper/filetable"
	"github.com/better-compute/bcd/components/helper/wire"
)

// opFunc runs one request that passed wire's Check and returns the answer
// and the outcome to log: ok, absent, refused or failed.
type opFunc func(srv *server, ctx context.Context, req *wire.Request) (*wire.Response, string)

// operations is the helper's table of operations. An operation is added
// with its name in wire (its fields and Check) and one line here; its
// implementation lives in a file of its own (slice_linux.go,
// gpu_linux.go, tpm_linux.go, ...).
var operations = map[string]opFunc{
	wire.OpPing:           (*server).ping,
	wire.OpFileWrite:      (*server).file,
	wire.OpFileRemove:     (*server).file,
	wire.OpFirewallCheck:  (*server).firewallCheck,
	wire.OpReboot:         (*server).reboot,
	wire.OpSSHReload:      (*server).sshReload,
	wire.OpAccessApply:    (*server).accessApply,
	wire.OpHostUnit:       (*server).hostUnit,
	wire.OpNetPolicyApply: (*server).netpolicyApply,
	wire.OpGPUReset:       (*server).gpuReset,
	wire.OpSliceApply:     (*server).sliceApply,
	wire.OpSliceRemove:    (*server).sliceRemove,
	wire.OpTPMNodeKey:     (*server).tpmNodeKey,
	wire.OpTPMSign:        (*server).tpmSign,
	wire.OpTPMAK:          (*server).tpmAK,
	wire.OpTPMCertify:     (*server).tpmCertify,
	wire.OpTPMRelease:     (*server).tpmRelease,

	wire.OpLibvirtDefine:     (*server).libvirt,
	wire.OpLibvirtStart:      (*server).libvirt,
	wire.OpLibvirtShutdown:   (*server).libvirt,
	wire.OpLibvirtDestroy:    (*server).libvirt,
	wire.OpLibvirtSuspend:    (*server).libvirt,
	wire.OpLibvirtResume:     (*server).libvirt,
	wire.OpLibvirtUndefine:   (*server).libvirt,
	wire.OpLibvirtConsole:    (*server).libvirt,
	wire.OpLibvirtSave:       (*server).libvirt,
	wire.OpLibvirtRestore:    (*server).libvirt,
	wire.OpLibvirtAttachDisk: (*server).libvirt,

	wire.OpUpdateStatus:      (*server).update,
	wire.OpUpdatePrepare:     (*server).update,
	wire.OpUpdateSwap:        (*server).update,
	wire.OpUpdateConfirm:     (*server).update,
	wire.OpUpdateSettle:      (*server).update,
	wire.OpUpdateRollback:    (*server).update,
	wire.OpUpdateClearFailed: (*server).update,
}

// do runs a checked request and returns its answer and outcome.
func (srv *server) do(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	op, ok := operations[req.Op]
	if !ok {
		return refused(fmt.Errorf("unknown operation %q", short(req.Op)))
	}
	return op(srv, ctx, req)
}

// Answers with their outcomes.
func ok() (*wire.Response, string) { return &wire.Response{OK: true}, "ok" }

func refused(err error) (*wire.Response, string) { return wire.Failed(err.Error(), false), "refused" }

func failed(err error, retryable bool) (*wire.Response, string) {
	return wire.Failed(err.Error(), retryable), "failed"
}

// ping answers ok: bcd doctor's check that the helper is there and lets
// the caller in.
func (srv *server) ping(context.Context, *wire.Request) (*wire.Response, string) { return ok() }

// file is file.write and file.remove through the file table.
func (srv *server) file(_ context.Context, req *wire.Request) (*wire.Response, string) {
	t, err := filetable.Resolve(req.Kind, req.ID)
	if err != nil {
		return refused(err)
	}
	owner := srv.s.euid
	if req.Op == wire.OpFileWrite {
		// A hold's CDI spec and environment file are checked before
		// anything on disk changes: a CDI hook would run as root.
		if resp, outcome := srv.checkHoldFile(t, req.Data); resp != nil {
			return resp, outcome
		}
		err = writeFile(srv.s.root, t, req.Data, owner)
	} else {
		var absent bool
		absent, err = removeFile(srv.s.root, t, owner)
		if err == nil && absent {
			return &wire.Response{OK: true}, "absent"
		}
	}
	if err != nil {
		err = fmt.Errorf("%s %s: %w", req.Op, t.Path(), err)
		var r *refusal
		if errors.As(err, &r) {
			return refused(err)
		}
		return failed(err, true)
	}
	return ok()
}

func (srv *server) firewallCheck(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	rules, loaded, err := srv.firewallRules(ctx)
	if err != nil {
		return failed(fmt.Errorf("firewall.check: %w", err), !errors.Is(err, errNoNft))
	}
	match := loaded && rules == *req.Rules
	return &wire.Response{OK: true, Rules: &rules, Loaded: &match}, "ok"
}

func (srv *server) reboot(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	reason := wire.CutReason(req.Reason)
	if srv.s.fakeHW {
		srv.log.Warn("helper: reboot (a fakehw build only logs it)", "reason", reason)
		return ok()
	}
	srv.log.Warn("helper: rebooting the host", "reason", reason)
	if err := srv.s.reboot(ctx, reason); err != nil {
		return failed(fmt.Errorf("reboot: %w", err), true)
	}
	return ok()
}

// sshReload reloads sshd after the access converger changed its files:
// systemctl reload of ssh.service (Debian, Ubuntu) or sshd.service (the
// rest), whichever systemd has loaded. A fakehw build only logs it.
func (srv *server) sshReload(ctx context.Context, _ *wire.Request) (*wire.Response, string) {
	if srv.s.fakeHW {
		srv.log.Info("helper: ssh.reload (a fakehw build only logs it)")
		return ok()
	}
	for _, unit := range []string{"ssh.service", "sshd.service"} {
		out, err := srv.s.systemctl(ctx, "show", "--property=LoadState", "--value", unit)
		if err != nil {
			return failed(fmt.Errorf("ssh.reload: %w", err), !errors.Is(err, errNoSystemctl))
		}
		if trimmed(out) != "loaded" {
			continue
		}
		if _, err := srv.s.systemctl(ctx, "reload", unit); err != nil {
			return failed(fmt.Errorf("ssh.reload: %w", err), true)
		}
		return ok()
	}
	return failed(errors.New("ssh.reload: neither ssh.service nor sshd.service is loaded on this host"), false)
}
