// Package filetable is the table of files bcd helper writes and removes for
// an unprivileged bcd node: each kind names one directory and a file name
// built from an id, so a request carries a kind and an id, never a path.
// Both the helper (which builds the path) and the node's client (which maps
// a path back to its kind and id, refusing any other path before it sends
// anything) use it. It imports nothing but the standard library's basics.
package filetable

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
)

// MaxFileSize bounds the content of one file.write: 1 MiB.
const MaxFileSize = 1 << 20

// Target is where one kind and id live.
type Target struct {
	Kind string
	ID   string      // "" for a kind without an id
	Dir  string      // absolute and clean, e.g. /etc/cdi
	Name string      // one path component, e.g. bcd-gpu0.json
	Mode fs.FileMode // 0644, or 0600 for k8s-token
}

// Path is the target's absolute path.
func (t Target) Path() string { return t.Dir + "/" + t.Name }

// entry is one row of the table. A kind with an id names Dir/Prefix+id+Suffix;
// a kind without one names Dir/Prefix.
type entry struct {
	kind   string
	dir    string
	prefix string
	suffix string
	idOK   func(string) bool // nil: the kind takes no id
	mode   fs.FileMode
}

var table = []entry{
	{kind: "cdi", dir: "/etc/cdi", prefix: "bcd-", suffix: ".json", idOK: allocID, mode: 0o644},
	// Not under /run/bcd: that is the node account's (its status socket),
	// and the helper writes only in directories root owns alone.
	{kind: "allocation-env", dir: "/run/bcd-alloc", suffix: ".env", idOK: allocID, mode: 0o644},
	{kind: "ssh-dropin", dir: "/etc/ssh/sshd_config.d", prefix: "10-better-compute.conf", mode: 0o644},
	{kind: "ssh-ca", dir: "/etc/ssh", prefix: "bc_ca.pub", mode: 0o644},
	{kind: "ssh-krl", dir: "/etc/ssh", prefix: "bc_krl", mode: 0o644},
	{kind: "ssh-principals", dir: "/etc/ssh/bc_principals", idOK: principalID, mode: 0o644},
	{kind: "k8s-token", dir: "/var/lib/bcd-hostconfig/k8s", prefix: "bootstrap-token", mode: 0o600},
}

// Kinds lists the kinds of the table in order.
func Kinds() []string {
	out := make([]string, len(table))
	for i, e := range table {
		out[i] = e.kind
	}
	return out
}

// ErrNotInTable is wrapped by every refusal of a kind, id or path.
var ErrNotInTable = errors.New("not in bcd helper's file table")

// Resolve builds the target of kind and id. A kind without an id must get
// id "". It fails, wrapping ErrNotInTable, for an unknown kind or an id
// that does not fit the kind.
func Resolve(kind, id string) (Target, error) {
	for _, e := range table {
		if e.kind != kind {
			continue
		}
		if e.idOK == nil {
			if id != "" {
				return Target{}, fmt.Errorf("file kind %s takes no id: %w", kind, ErrNotInTable)
			}
			return Target{Kind: kind, Dir: e.dir, Name: e.prefix, Mode: e.mode}, nil
		}
		if !e.idOK(id) {
			return Target{}, fmt.Errorf("id %q does not fit file kind %s: %w", clip(id), kind, ErrNotInTable)
		}
		return Target{Kind: kind, ID: id, Dir: e.dir, Name: e.prefix + id + e.suffix, Mode: e.mode}, nil
	}
	return Target{}, fmt.Errorf("unknown file kind %q: %w", clip(kind), ErrNotInTable)
}

// Lookup maps an absolute, clean path to its kind and id. Any other path,
// a relative or unclean one included, fails wrapping ErrNotInTable.
func Lookup(p string) (Target, error) {
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return Target{}, fmt.Errorf("path %q is not absolute and clean: %w", clip(p), ErrNotInTable)
	}
	dir, name := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	for _, e := range table {
		if e.dir != dir {
			continue
		}
		if e.idOK == nil {
			if name == e.prefix {
				return Resolve(e.kind, "")
			}
			continue
		}
		if len(name) > len(e.prefix)+len(e.suffix) && strings.HasPrefix(name, e.prefix) && strings.HasSuffix(name, e.suffix) {
			id := name[len(e.prefix) : len(name)-len(e.suffix)]
			if e.idOK(id) {
				return Resolve(e.kind, id)
			}
		}
	}
	return Target{}, fmt.Errorf("path %q: %w", clip(p), ErrNotInTable)
}

// allocID is [A-Za-z0-9_-], 1 to 128 characters.
func allocID(id string) bool {
	return idOf(id, 128, func(c byte) bool { return c == '_' || c == '-' })
}

// principalID is [A-Za-z0-9._@-], 1 to 64 characters, and never "." or "..".
func principalID(id string) bool {
	if id == "." || id == ".." {
		return false
	}
	return idOf(id, 64, func(c byte) bool { return c == '.' || c == '_' || c == '@' || c == '-' })
}

func idOf(id string, max int, extra func(byte) bool) bool {
	if len(id) == 0 || len(id) > max {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || extra(c)) {
			return false
		}
	}
	return true
}

// clip keeps error messages short whatever a caller sent.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// CheckK8sToken accepts what a k8s-token file may hold: exactly one
// kubeadm bootstrap token, [a-z0-9]{6}.[a-z0-9]{16} (its id and its
// secret), with at most one newline after it. The file lands in root's
// directory, so anything else (another line, a space, an empty file) is
// refused. The error never quotes the content: it is a secret.
func CheckK8sToken(data []byte) error {
	b := data
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	const form = "a k8s-token file holds one kubeadm bootstrap token, [a-z0-9]{6}.[a-z0-9]{16}, and at most a newline after it"
	if len(b) != 6+1+16 {
		return fmt.Errorf("%d bytes: %s", len(data), form)
	}
	for i, c := range b {
		if i == 6 {
			if c != '.' {
				return errors.New("no '.' after the token id: " + form)
			}
			continue
		}
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return fmt.Errorf("byte %d is not [a-z0-9]: %s", i, form)
		}
	}
	return nil
}
