// Package privfile reads a small file that holds a secret (a private key,
// a key-encryption key): a regular file, readable by its owner only, and
// no larger than the caller says. What it returns is the caller's to
// clear once parsed; no error names the file's contents.
package privfile

import (
	"fmt"
	"io"
	"os"
)

// Read reads the secret file at path, refusing one that is not a regular
// file, that group or others may read, or that is over max bytes (hint
// says what the file should be, for that error).
func Read(path string, max int64, hint string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is readable by group or others (mode %v); chmod 600 it", path, st.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		clear(b)
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > max {
		clear(b)
		return nil, fmt.Errorf("%s is over %d bytes; %s", path, max, hint)
	}
	return b, nil
}
