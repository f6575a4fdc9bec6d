package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/BurntSushi/toml"
)

// header starts every file Marshal writes.
const header = `# bcd configuration. Unknown keys are errors; see docs/configuration.md.
# Written by bcd; edit with care and check with "bcd doctor".

`

// Marshal encodes c as TOML with a short comment header. Empty keys and
// empty sections are left out. c must pass Validate, so that the result
// loads again with Parse.
func (c *Config) Marshal() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("encoding config: %w", err)
	}
	var buf bytes.Buffer
	buf.WriteString(header)
	enc := toml.NewEncoder(&buf)
	enc.Indent = ""
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("encoding config: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteFile writes c to path atomically with mode 0600: it writes a
// temporary file in the same directory, syncs it, and renames it into place.
// A missing parent directory is created with mode 0755. c.Path is not
// changed.
func WriteFile(path string, c *Config) error {
	data, err := c.Marshal()
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating config directory: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("creating temporary config file: %w", err)
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done { // a step failed: leave no temporary file behind
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("chmod %s 0600: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	done = true
	// Sync the directory so the rename survives a crash; not every file
	// system supports it, so a failure here is not an error.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
