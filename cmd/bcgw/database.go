package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/better-compute/bcd/components/base/privfile"
)

// maxDatabaseFile bounds --database-file: one URL.
const maxDatabaseFile = 4096

// databaseURL picks the store's PostgreSQL URL from --database or
// --database-file ("" for the bbolt store in the data directory). A URL
// given on the command line must not carry a password, which anyone can
// read in the process list: a password goes in the file, in PGPASSWORD
// or in ~/.pgpass. The file is read under the key-encryption key file's
// rule (privfile): a regular file that group and others cannot read.
func databaseURL(flag, file string) (string, error) {
	if flag != "" && file != "" {
		return "", errors.New("give --database or --database-file, not both")
	}
	if flag != "" {
		if hasPassword(flag) {
			return "", errors.New("--database: the URL carries a password, which the process list would show; put the URL in a file and pass --database-file, or use PGPASSWORD or ~/.pgpass")
		}
		return flag, nil
	}
	if file == "" {
		return "", nil
	}
	b, err := privfile.Read(file, maxDatabaseFile, "a database URL file is one line")
	if err != nil {
		return "", fmt.Errorf("--database-file: %w", err)
	}
	defer clear(b)
	u := strings.TrimSpace(string(b))
	if u == "" || strings.ContainsAny(u, "\n\r") {
		return "", fmt.Errorf("--database-file %s: want one line, the database URL", file)
	}
	return u, nil
}

// hasPassword reports whether a postgres:// URL or key=value connection
// string names a password.
func hasPassword(s string) bool {
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		u, err := url.Parse(s)
		if err != nil {
			return true // unparsable: do not risk showing it
		}
		_, set := u.User.Password()
		return set || u.Query().Has("password")
	}
	return strings.Contains(s, "password")
}
