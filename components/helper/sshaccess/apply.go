// Package sshaccess applies the SSH part of the access section: it checks
// the accounts (local, and not root or system accounts unless root's own
// configuration allows them), renders every file itself from the fields
// (components/base/sshspec), the sshd drop-in included, and writes them:
// sshd -t must accept the result before sshd reloads, or the previous
// files are put back. bcd helper runs it for an unprivileged node, bcd node
// itself when it runs as root; the node never sends file content.
// docs/access.md describes it.
package sshaccess

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/base/sshspec"
	"github.com/better-compute/bcd/components/helper/filetable"
)

// The fields and their checks (components/base/sshspec).
type Spec = sshspec.Spec

var (
	ErrInvalid = sshspec.ErrInvalid
	Decode     = sshspec.Decode
	ParseCA    = sshspec.ParseCA
	IsKeyword  = sshspec.IsKeyword
)

// Errors Apply wraps besides ErrInvalid.
var (
	// ErrAccount: an account is not local, or is root or a system account
	// that root's configuration does not allow.
	ErrAccount = errors.New("account refused")
	// ErrRejected: sshd -t refused the result; the previous files are back.
	ErrRejected = errors.New("sshd -t rejected the result; the previous files were put back")
)

// SystemUIDMax is the highest uid of a system account (Debian's
// SYS_UID_MAX is 999); nobody (65534) is a system account too.
const SystemUIDMax = 999

// Files reads and writes the file table's ssh-* kinds under a root.
type Files interface {
	// Read returns a file's content; present is false when there is none.
	Read(t filetable.Target) (data []byte, present bool, err error)
	Write(t filetable.Target, data []byte) error
	Remove(t filetable.Target) error
	// Principals lists the accounts that have a principals file.
	Principals() ([]string, error)
}

// Host is what Apply and Observe need of the machine.
type Host struct {
	// Root is the file table's root: "/" on a host; a directory of its own
	// in tests and fakehw builds. The drop-in names paths under it.
	Root  string
	Files Files
	// Account looks a local account up: its uid.
	Account func(name string) (uid int, err error)
	// AllowSystem lists root and system accounts root's own configuration
	// lets the section name ([helper] ssh_system_accounts, or the node's
	// when it runs as root).
	AllowSystem []string
	// KeyGen runs ssh-keygen with args; SSHDTest runs sshd -t on the
	// host's whole configuration; Reload reloads sshd.
	KeyGen   func(ctx context.Context, args ...string) ([]byte, error)
	SSHDTest func(ctx context.Context) error
	Reload   func(ctx context.Context) error
	// TempDir is a private directory for ssh-keygen's input and output
	// ("" : os.TempDir()).
	TempDir string
}

// Result says what Apply did.
type Result struct {
	Changed  []string // the files written or removed
	Reloaded bool     // the drop-in changed and sshd was reloaded
}

func target(kind, id string) filetable.Target {
	t, err := filetable.Resolve(kind, id)
	if err != nil {
		panic(err) // the table's own kinds without an id, or a checked account
	}
	return t
}

// hostPath is t's path under root, as sshd reads it.
func hostPath(root string, t filetable.Target) string { return filepath.Join(root, t.Path()) }

// Dropin renders the sshd drop-in for root: it never changes with the
// section's content, so sshd is reloaded only when SSH access is turned on
// or off, and reads the CA, the KRL and the principals anew per connection.
func Dropin(root string) ([]byte, error) {
	if !filepath.IsAbs(root) || strings.ContainsAny(root, " \t\r\n\"%#") {
		return nil, fmt.Errorf("root %q must be absolute with no space, quote, %% or #", root)
	}
	var b bytes.Buffer
	b.WriteString("# Rendered by bcd from the access section; bcd replaces any edit.\n")
	fmt.Fprintf(&b, "TrustedUserCAKeys %s\n", hostPath(root, target("ssh-ca", "")))
	fmt.Fprintf(&b, "RevokedKeys %s\n", hostPath(root, target("ssh-krl", "")))
	fmt.Fprintf(&b, "AuthorizedPrincipalsFile %s/%%u\n", filepath.Join(root, target("ssh-principals", "x").Dir))
	return b.Bytes(), nil
}

// RenderCA is the CA file: "type base64\n", the comment dropped.
func RenderCA(line string) ([]byte, error) {
	typ, blob, err := ParseCA(line)
	if err != nil {
		return nil, err
	}
	return []byte(typ + " " + base64.StdEncoding.EncodeToString(blob) + "\n"), nil
}

// RenderPrincipals is one account's principals file: one per line, sorted.
func RenderPrincipals(ps []string) []byte {
	s := slices.Clone(ps)
	sort.Strings(s)
	return []byte(strings.Join(s, "\n") + "\n")
}

// krlSpec is ssh-keygen -k's input for s's revocations.
func krlSpec(s Spec) []byte {
	var b bytes.Buffer
	serials := slices.Clone(s.RevokedSerials)
	slices.Sort(serials)
	for _, n := range slices.Compact(serials) {
		fmt.Fprintf(&b, "serial: %d\n", n)
	}
	ids := slices.Clone(s.RevokedKeyIDs)
	sort.Strings(ids)
	for _, id := range slices.Compact(ids) {
		fmt.Fprintf(&b, "id: %s\n", id)
	}
	return b.Bytes()
}

// CheckAccounts refuses an account that is not local, or that is root or
// a system account unless h.AllowSystem names it.
func (h *Host) CheckAccounts(s Spec) error {
	for _, a := range s.Accounts() {
		uid, err := h.Account(a)
		if err != nil {
			return fmt.Errorf("%w: %s is not a local account: %v", ErrAccount, a, err)
		}
		if (uid == 0 || uid <= SystemUIDMax || uid == 65534) && !slices.Contains(h.AllowSystem, a) {
			what := "a system account"
			if uid == 0 {
				what = "root"
			}
			return fmt.Errorf("%w: %s (uid %d) is %s; root's configuration does not allow it (ssh_system_accounts)", ErrAccount, a, uid, what)
		}
	}
	return nil
}

// rendered is every file of a Spec; nil content means absent.
type rendered struct {
	dropin, ca, krl []byte
	principals      map[string][]byte
}

func (h *Host) render(ctx context.Context, s Spec) (*rendered, error) {
	r := &rendered{principals: map[string][]byte{}}
	if s.Empty() {
		return r, nil
	}
	var err error
	if r.dropin, err = Dropin(h.Root); err != nil {
		return nil, err
	}
	if r.ca, err = RenderCA(s.UserCA); err != nil {
		return nil, fmt.Errorf("%w: user_ca: %v", ErrInvalid, err)
	}
	for a, ps := range s.Principals {
		r.principals[a] = RenderPrincipals(ps)
	}
	// The KRL: ssh-keygen -k from the revocations, in a private directory.
	dir, err := os.MkdirTemp(h.TempDir, "bcd-krl-")
	if err != nil {
		return nil, fmt.Errorf("a directory for the KRL: %w", err)
	}
	defer os.RemoveAll(dir)
	ca, spec, krl := filepath.Join(dir, "ca.pub"), filepath.Join(dir, "spec"), filepath.Join(dir, "krl")
	if err := os.WriteFile(ca, r.ca, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(spec, krlSpec(s), 0o600); err != nil {
		return nil, err
	}
	// ssh-keygen -l proves OpenSSH reads the CA key, not only its shape.
	if _, err := h.KeyGen(ctx, "-l", "-f", ca); err != nil {
		return nil, fmt.Errorf("%w: user_ca: OpenSSH does not read it: %v", ErrInvalid, err)
	}
	if _, err := h.KeyGen(ctx, "-k", "-f", krl, "-s", ca, spec); err != nil {
		return nil, fmt.Errorf("rendering the KRL: %w", err)
	}
	if r.krl, err = os.ReadFile(krl); err != nil {
		return nil, fmt.Errorf("reading the rendered KRL: %w", err)
	}
	return r, nil
}

// saved is a file's content before Apply changed it.
type saved struct {
	t       filetable.Target
	data    []byte
	present bool
}

// Apply checks s (fields and accounts), renders every file and writes them,
// removing what s no longer names; then sshd -t must accept the whole
// configuration, or every file is put back as it was (ErrRejected). sshd
// is reloaded only when the drop-in changed. An empty s removes everything.
func Apply(ctx context.Context, h *Host, s Spec) (Result, error) {
	var res Result
	if err := s.Check(); err != nil {
		return res, err
	}
	if err := h.CheckAccounts(s); err != nil {
		return res, err
	}
	r, err := h.render(ctx, s)
	if err != nil {
		return res, err
	}
	// What to write (content) or remove (nil), the drop-in last when
	// writing and first when removing, so sshd never names a missing file.
	type change struct {
		t    filetable.Target
		data []byte
	}
	var changes []change
	had, err := h.Files.Principals()
	if err != nil {
		return res, fmt.Errorf("listing principals files: %w", err)
	}
	files := []change{{target("ssh-ca", ""), r.ca}, {target("ssh-krl", ""), r.krl}}
	for _, a := range s.Accounts() {
		files = append(files, change{target("ssh-principals", a), r.principals[a]})
	}
	for _, a := range had {
		if _, ok := r.principals[a]; !ok {
			if t, err := filetable.Resolve("ssh-principals", a); err == nil {
				files = append(files, change{t, nil})
			}
		}
	}
	dropin := change{target("ssh-dropin", ""), r.dropin}
	if r.dropin == nil {
		changes = append([]change{dropin}, files...)
	} else {
		changes = append(files, dropin)
	}
	var undo []saved
	dropinChanged := false
	for _, c := range changes {
		old, present, err := h.Files.Read(c.t)
		if err != nil {
			return res, h.restore(undo, fmt.Errorf("reading %s: %w", c.t.Path(), err))
		}
		if present == (c.data != nil) && bytes.Equal(old, c.data) {
			continue
		}
		if c.t.Kind == "ssh-krl" && present && c.data != nil {
			// A KRL carries the time it was made: rewrite it only when
			// what it revokes changed.
			if same, _ := h.sameKRL(ctx, old, c.data); same {
				continue
			}
		}
		undo = append(undo, saved{c.t, old, present})
		if c.data == nil {
			err = h.Files.Remove(c.t)
		} else {
			err = h.Files.Write(c.t, c.data)
		}
		if err != nil {
			return res, h.restore(undo, fmt.Errorf("%s: %w", c.t.Path(), err))
		}
		res.Changed = append(res.Changed, c.t.Path())
		if c.t.Kind == "ssh-dropin" {
			dropinChanged = true
		}
	}
	if len(undo) == 0 {
		return res, nil
	}
	if err := h.SSHDTest(ctx); err != nil {
		res.Changed = nil
		return res, h.restore(undo, fmt.Errorf("%w: %v", ErrRejected, err))
	}
	if dropinChanged {
		if err := h.Reload(ctx); err != nil {
			return res, fmt.Errorf("reloading sshd: %w", err)
		}
		res.Reloaded = true
	}
	return res, nil
}

// restore puts back the files in undo, last changed first, and returns
// cause, with any failure to put one back added.
func (h *Host) restore(undo []saved, cause error) error {
	var errs []error
	for i := len(undo) - 1; i >= 0; i-- {
		u := undo[i]
		var err error
		if u.present {
			err = h.Files.Write(u.t, u.data)
		} else {
			err = h.Files.Remove(u.t)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("putting %s back: %w", u.t.Path(), err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w (and %v)", cause, errors.Join(errs...))
	}
	return cause
}

// sameKRL reports whether two KRLs revoke the same.
func (h *Host) sameKRL(ctx context.Context, a, b []byte) (bool, error) {
	la, err := h.listKRL(ctx, a)
	if err != nil {
		return false, err
	}
	lb, err := h.listKRL(ctx, b)
	if err != nil {
		return false, err
	}
	return slices.Equal(la, lb), nil
}

// listKRL is what a KRL revokes, as sorted "serial: N" and "id: X" lines
// (ssh-keygen -Q -l), ranges expanded.
func (h *Host) listKRL(ctx context.Context, krl []byte) ([]string, error) {
	dir, err := os.MkdirTemp(h.TempDir, "bcd-krl-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "krl")
	if err := os.WriteFile(p, krl, 0o600); err != nil {
		return nil, err
	}
	out, err := h.KeyGen(ctx, "-Q", "-l", "-f", p)
	if err != nil {
		return nil, err
	}
	return parseKRLList(out)
}

// parseKRLList reads ssh-keygen -Q -l's listing: comments and blank lines
// skipped, "serial: N" or "serial: A-B" expanded (at most sshspec.MaxRevoked),
// "id: X" kept, anything else (keys, hashes bcd never revokes) kept as is.
func parseKRLList(out []byte) ([]string, error) {
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if v, ok := strings.CutPrefix(l, "serial: "); ok {
			lo, hi, isRange := strings.Cut(v, "-")
			a, err := strconv.ParseUint(lo, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("KRL listing: %q", clip(l))
			}
			b := a
			if isRange {
				if b, err = strconv.ParseUint(hi, 10, 64); err != nil || b < a || b-a >= sshspec.MaxRevoked {
					return nil, fmt.Errorf("KRL listing: %q", clip(l))
				}
			}
			for n := a; ; n++ {
				lines = append(lines, "serial: "+strconv.FormatUint(n, 10))
				if n == b {
					break
				}
			}
			continue
		}
		lines = append(lines, l)
	}
	sort.Strings(lines)
	return slices.Compact(lines), nil
}

// Plan compares the files on the host with s's and lists what differs
// (empty: converged). It reads, renders and runs ssh-keygen only; it
// neither checks accounts nor writes.
func Plan(ctx context.Context, h *Host, s Spec) ([]string, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	var changes []string
	cmp := func(t filetable.Target, want []byte, krl bool) error {
		old, present, err := h.Files.Read(t)
		if err != nil {
			return fmt.Errorf("reading %s: %w", t.Path(), err)
		}
		switch {
		case want == nil && present:
			changes = append(changes, "remove "+t.Path())
		case want != nil && !present:
			changes = append(changes, "write "+t.Path())
		case want != nil && krl:
			wantList, err := parseKRLList(krlSpec(s))
			if err != nil {
				return err
			}
			have, err := h.listKRL(ctx, old)
			if err != nil || !slices.Equal(have, wantList) {
				changes = append(changes, "write "+t.Path())
			}
		case want != nil && !bytes.Equal(old, want):
			changes = append(changes, "write "+t.Path())
		}
		return nil
	}
	var dropin, ca, krlMark []byte
	principals := map[string][]byte{}
	if !s.Empty() {
		var err error
		if dropin, err = Dropin(h.Root); err != nil {
			return nil, err
		}
		if ca, err = RenderCA(s.UserCA); err != nil {
			return nil, err
		}
		krlMark = []byte{}
		for a, ps := range s.Principals {
			principals[a] = RenderPrincipals(ps)
		}
	}
	for _, c := range []struct {
		t    filetable.Target
		want []byte
		krl  bool
	}{{target("ssh-dropin", ""), dropin, false}, {target("ssh-ca", ""), ca, false}, {target("ssh-krl", ""), krlMark, true}} {
		if err := cmp(c.t, c.want, c.krl); err != nil {
			return nil, err
		}
	}
	had, err := h.Files.Principals()
	if err != nil {
		return nil, err
	}
	for _, a := range s.Accounts() {
		if err := cmp(target("ssh-principals", a), principals[a], false); err != nil {
			return nil, err
		}
	}
	for _, a := range had {
		if _, ok := principals[a]; !ok {
			changes = append(changes, "remove "+target("ssh-principals", a).Path())
		}
	}
	return changes, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
