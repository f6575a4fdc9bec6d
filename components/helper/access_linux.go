//go:build linux

package helper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/base/strictjson"
	"github.com/better-compute/bcd/components/helper/filetable"
	"github.com/better-compute/bcd/components/helper/sshaccess"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// accessMu runs one access.apply at a time: each puts back what it changed
// when sshd -t refuses, which another apply in between would confuse.
var accessMu sync.Mutex

// accessApply is access.apply: the helper takes the access section only
// from a signed spec. It checks the proof under its own anchors (the
// signature by a command-signing root root holds, for the node root is
// bound to, no older than the last it applied, the section's digest the
// one signed), decodes the section's SSH fields itself, checks the
// accounts against the host and root's [access] system_accounts, renders
// sshd's files, the drop-in included, writes them through the file
// table's walker, has sshd -t accept the result or puts the previous
// files back, and reloads sshd only when the drop-in changed.
func (srv *server) accessApply(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	proof, err := rootsig.DecodeProof(req.Proof)
	if err != nil {
		return refused(fmt.Errorf("access.apply: %w", err))
	}
	accessMu.Lock()
	defer accessMu.Unlock()
	anchors, err := srv.anchors()
	if err != nil {
		return refused(fmt.Errorf("access.apply: %w", err))
	}
	commit, err := anchors.Admit(proof, "access", req.Section)
	if err != nil {
		return refused(fmt.Errorf("access.apply refused: %w", err))
	}
	spec, err := sshFields(req.Section)
	if err != nil {
		return refused(fmt.Errorf("access.apply: %w", err))
	}
	h := srv.sshHost()
	res, err := sshaccess.Apply(ctx, h, spec)
	if err != nil {
		err = fmt.Errorf("access.apply: %w", err)
		var r *refusal
		if errors.Is(err, sshaccess.ErrInvalid) || errors.Is(err, sshaccess.ErrAccount) || errors.As(err, &r) {
			return refused(err)
		}
		// sshd -t refusing is not retryable with the same section.
		return failed(err, !errors.Is(err, sshaccess.ErrRejected))
	}
	if err := commit(); err != nil {
		return failed(fmt.Errorf("access.apply: %w", err), true)
	}
	if len(res.Changed) > 0 {
		srv.log.Info("helper: access.apply", "changed", res.Changed, "reloaded", res.Reloaded, "generation", proof.Generation)
	}
	return ok()
}

// sshFields decodes the access section's ssh object strictly (an absent
// section or ssh object: nothing, so every file is removed). The section's
// other field, ticket_jwks, is the node's: the tunnels verify tickets.
func sshFields(section []byte) (sshaccess.Spec, error) {
	var body struct {
		SSH        json.RawMessage `json:"ssh,omitempty"`
		TicketJWKS json.RawMessage `json:"ticket_jwks,omitempty"`
	}
	if len(bytes.TrimSpace(section)) == 0 {
		return sshaccess.Spec{}, nil
	}
	if err := strictjson.Decode(section, &body); err != nil {
		return sshaccess.Spec{}, fmt.Errorf("access section: %w", err)
	}
	if len(body.SSH) == 0 || string(body.SSH) == "null" {
		return sshaccess.Spec{}, nil
	}
	return sshaccess.Decode(body.SSH)
}

// sshHost is the sshaccess.Host of this helper: its file table root, files
// through the walker that refuses symlinks, ssh-keygen and sshd found in
// the system directories, and sshd reloaded with systemctl (a root other
// than "/", in tests: SIGHUP to root/run/sshd.pid; a fakehw build on "/"
// only logs it).
func (srv *server) sshHost() *sshaccess.Host {
	root := srv.s.root
	h := sshaccess.SystemHost(root, helperFiles{root: root, owner: srv.s.euid}, srv.cfg.SystemAccounts)
	if srv.s.sshAccount != nil {
		h.Account = srv.s.sshAccount
	}
	if srv.s.sshdTest != nil {
		h.SSHDTest = srv.s.sshdTest
	}
	if path.Clean(root) == "/" {
		h.Reload = func(ctx context.Context) error {
			if resp, _ := srv.sshReload(ctx, nil); !resp.OK {
				return errors.New(resp.Error)
			}
			return nil
		}
	}
	return h
}

// helperFiles is sshaccess.Files through the helper's own walker: every
// directory on the way root's and closed to others, no symlink followed.
type helperFiles struct {
	root  string
	owner int
}

func (f helperFiles) Read(t filetable.Target) ([]byte, bool, error) {
	dfd, missing, err := openDir(f.root, t.Dir, f.owner, false)
	if err != nil || missing {
		return nil, false, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, t.Name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, refuse("open %s: %v", path.Join(f.root, t.Path()), err)
	}
	file := os.NewFile(uintptr(fd), t.Name)
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, false, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > filetable.MaxFileSize {
		return nil, false, refuse("%s is not a regular file of at most %d bytes", path.Join(f.root, t.Path()), filetable.MaxFileSize)
	}
	b := make([]byte, fi.Size())
	n, err := file.ReadAt(b, 0)
	if err != nil && n != len(b) {
		return nil, false, err
	}
	return b, true, nil
}

func (f helperFiles) Write(t filetable.Target, data []byte) error {
	return writeFile(f.root, t, data, f.owner)
}

func (f helperFiles) Remove(t filetable.Target) error {
	_, err := removeFile(f.root, t, f.owner)
	return err
}

func (f helperFiles) Principals() ([]string, error) {
	probe, _ := filetable.Resolve("ssh-principals", "x")
	dfd, missing, err := openDir(f.root, probe.Dir, f.owner, false)
	if err != nil || missing {
		return nil, err
	}
	unix.Close(dfd)
	return sshaccess.ListPrincipals(path.Join(f.root, probe.Dir))
}
