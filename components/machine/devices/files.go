package devices

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/helper/filetable"
	"github.com/better-compute/bcd/components/helper/helperclient"
)

// DirFiles keeps hold files under Root + the file table's paths: "/" when
// bcd node runs as root; a directory of its own in a fakehw build and in
// tests. Reads and lists always go here (the files are world-readable).
type DirFiles struct {
	Root string
	// Helper, when set, writes and removes through bcd helper instead
	// (bcd node unprivileged); Root is then "/".
	Helper *helperclient.Client
}

func (d DirFiles) target(kind, id string) (filetable.Target, string, error) {
	t, err := filetable.Resolve(kind, id)
	if err != nil {
		return t, "", err
	}
	return t, filepath.Join(d.Root, t.Path()), nil
}

// Read returns a hold file's content.
func (d DirFiles) Read(kind, id string) ([]byte, error) {
	_, p, err := d.target(kind, id)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}

// List returns the allocation ids with a file of kind.
func (d DirFiles) List(kind string) ([]string, error) {
	probe, _, err := d.target(kind, "x")
	if err != nil {
		return nil, err
	}
	prefix, suffix, _ := strings.Cut(probe.Name, "x")
	ents, err := os.ReadDir(filepath.Join(d.Root, probe.Dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		n := e.Name()
		if len(n) > len(prefix)+len(suffix) && strings.HasPrefix(n, prefix) && strings.HasSuffix(n, suffix) {
			id := n[len(prefix) : len(n)-len(suffix)]
			if _, err := filetable.Resolve(kind, id); err == nil {
				ids = append(ids, id)
			}
		}
	}
	return ids, nil
}

// Write writes a hold file atomically (through the helper when set).
func (d DirFiles) Write(ctx context.Context, kind, id string, data []byte) error {
	t, p, err := d.target(kind, id)
	if err != nil {
		return err
	}
	if d.Helper != nil {
		return d.Helper.WriteFile(ctx, t.Path(), data)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", filepath.Dir(p), err)
	}
	return atomicfile.Write(p, data, t.Mode)
}

// Remove removes a hold file; one that is not there is not an error.
func (d DirFiles) Remove(ctx context.Context, kind, id string) error {
	t, p, err := d.target(kind, id)
	if err != nil {
		return err
	}
	if d.Helper != nil {
		return d.Helper.RemoveFile(ctx, t.Path())
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
