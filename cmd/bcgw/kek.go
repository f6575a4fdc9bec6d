package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/kek"
)

// kekCredential is the key-encryption key's name as a systemd credential
// (LoadCredential=bcgw-kek:FILE puts it in $CREDENTIALS_DIRECTORY).
const kekCredential = "bcgw-kek"

// kekFile picks the key-encryption key's file: --key-encryption-key, else
// the systemd credential bcgw-kek when the service has one, else "".
func kekFile(flag string, getenv func(string) string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	dir := getenv("CREDENTIALS_DIRECTORY")
	if dir == "" {
		return "", nil
	}
	p := filepath.Join(dir, kekCredential)
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("credential %s: %w", kekCredential, err)
	}
	return p, nil
}

// kekCmd is `bcgw kek generate [--out FILE]` and `bcgw kek fingerprint FILE`.
func kekCmd(_ context.Context, env *cli.Env, args []string) int {
	const usage = "usage: bcgw kek generate [--out FILE] | bcgw kek fingerprint FILE"
	if len(args) == 0 {
		return cli.Usagef(env, usage)
	}
	switch args[0] {
	case "generate":
		fs := cli.NewFlagSet(env, "bcgw", "kek generate")
		out := fs.String("out", "", "write the key to this new file (mode 0600) instead of stdout")
		if code, ok := cli.Parse(fs, env, args[1:], ""); !ok {
			return code
		}
		k, file, err := kek.Generate()
		if err != nil {
			return cli.Fail(env, "bcgw kek generate", err)
		}
		defer clear(file)
		if *out == "" {
			if _, err := env.Stdout.Write(file); err != nil {
				return cli.Fail(env, "bcgw kek generate", err)
			}
		} else if err := writeNew(*out, file); err != nil {
			return cli.Fail(env, "bcgw kek generate", err)
		}
		fmt.Fprintf(env.Stderr, "bcgw kek generate: key-encryption key %s; give every gateway of the fleet the same file (--key-encryption-key, or LoadCredential=%s:FILE)\n", k.Fingerprint(), kekCredential)
		return 0
	case "fingerprint":
		pos, code, ok := parseInterleaved(cli.NewFlagSet(env, "bcgw", "kek fingerprint"), env, args[1:], 1, "bcgw kek fingerprint FILE")
		if !ok {
			return code
		}
		k, err := kek.ReadFile(pos[0])
		if err != nil {
			return cli.Fail(env, "bcgw kek fingerprint", err)
		}
		fmt.Fprintln(env.Stdout, k.Fingerprint())
		return 0
	}
	return cli.Usagef(env, usage)
}

// writeNew writes b to a file that must not exist yet, mode 0600, synced.
func writeNew(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return f.Close()
}
