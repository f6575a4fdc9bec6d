package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/store/pgstore"
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
func kekCmd(ctx context.Context, env *cli.Env, args []string) int {
	const usage = "usage: bcgw kek generate [--out FILE] | bcgw kek fingerprint FILE | " +
		"bcgw kek rotate --database-file F --key-encryption-key OLD --new NEW [--json]"
	if len(args) == 0 {
		return cli.Usagef(env, usage)
	}
	switch args[0] {
	case "rotate":
		return kekRotate(ctx, env, args[1:])
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
		fs := cli.NewFlagSet(env, "bcgw", "kek fingerprint")
		asJSON := fs.Bool("json", false, "print {\"fingerprint\"}")
		pos, code, ok := parseInterleaved(fs, env, args[1:], 1, "bcgw kek fingerprint FILE [--json]")
		if !ok {
			return code
		}
		k, err := kek.ReadFile(pos[0])
		if err != nil {
			return cli.Fail(env, "bcgw kek fingerprint", err)
		}
		if *asJSON {
			return printJSON(env, map[string]string{"fingerprint": k.Fingerprint()})
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

// kekRotate is `bcgw kek rotate`: the database's key set and operator
// secrets sealed anew under another key-encryption key (docs/gateway-store.md).
func kekRotate(ctx context.Context, env *cli.Env, args []string) int {
	const prefix = "bcgw kek rotate"
	fs := cli.NewFlagSet(env, "bcgw", "kek rotate")
	db := fs.String("database", "", "the fleet's PostgreSQL URL (no password: use --database-file)")
	dbFile := fs.String("database-file", "", "a file holding the fleet's PostgreSQL URL")
	oldFile := fs.String("key-encryption-key", "", "the key-encryption key the keys are sealed under now")
	newFile := fs.String("new", "", "the new key-encryption key (bcgw kek generate --out FILE)")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	if *oldFile == "" || *newFile == "" {
		return cli.Usagef(env, "%s: --key-encryption-key and --new are required", prefix)
	}
	url, err := databaseURL(*db, *dbFile)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if url == "" {
		return cli.Usagef(env, "%s: --database-file (or --database) is required: a bbolt gateway keeps its keys as files, under no key-encryption key", prefix)
	}
	oldK, err := kek.ReadFile(*oldFile)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	newK, err := kek.ReadFile(*newFile)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	st, err := pgstore.Open(ctx, url)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	defer st.Close()
	secrets, err := fleet.ResealSecrets(st, oldK, newK)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	n, err := keys.Reseal(st, oldK, newK)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if *asJSON {
		return printJSON(env, map[string]any{"old": oldK.Fingerprint(), "new": newK.Fingerprint(), "keys": n, "secrets": secrets})
	}
	fmt.Fprintf(env.Stdout, "%s\n", newK.Fingerprint())
	fmt.Fprintf(env.Stderr, "%s: %d keys and %d operator secrets sealed under %s (were %s); restart every gateway with the new file, one after another\n",
		prefix, n, secrets, newK.Fingerprint(), oldK.Fingerprint())
	return 0
}
