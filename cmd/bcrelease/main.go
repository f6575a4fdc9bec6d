// Command bcrelease makes and signs bcd's release manifests offline
// (docs/update.md): the release keys live with the people who release,
// never in bcgw. `bcrelease key` makes a key and prints its pin (what
// nodes put in [update] release_pins); `bcrelease make` writes an
// unsigned manifest from the built binaries; each release key holder runs
// `bcrelease sign`; `bcrelease verify` checks one as a node would.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/release"
)

func main() {
	os.Exit(program().Main(context.Background(), cli.StdEnv(), os.Args[1:]))
}

func program() *cli.Program {
	return &cli.Program{
		Name: "bcrelease",
		Commands: []cli.Command{
			{Name: "key", Summary: "key --out FILE: make a release key (P-256, mode 0600) and print its pin", Run: keyCmd},
			{Name: "make", Summary: "make --version V --sequence N --expires D --artifact ROLE/ARCH=FILE@URL ... --out FILE: an unsigned manifest", Run: makeCmd},
			{Name: "sign", Summary: "sign --key FILE --in FILE [--out FILE]: add a release key's signature", Run: signCmd},
			{Name: "verify", Summary: "verify --in FILE --pin P ... --threshold K [--floor N]: check a manifest as a node would", Run: verifyCmd},
		},
		Version: cli.VersionInfo{Version: buildinfo.Version, Commit: buildinfo.Commit, Tags: buildinfo.Tags()},
	}
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func keyCmd(_ context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcrelease", "key")
	out := fs.String("out", "", "where to write the key (created 0600; an existing file is refused)")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	if *out == "" {
		return cli.Usagef(env, "bcrelease key: --out FILE is needed")
	}
	if _, err := os.Stat(*out); err == nil {
		return cli.Fail(env, "bcrelease key", fmt.Errorf("%s exists; a release key is never overwritten", *out))
	}
	k, err := pki.GenerateKey()
	if err != nil {
		return cli.Fail(env, "bcrelease key", err)
	}
	pem, err := pki.MarshalPrivateKeyPEM(k)
	if err != nil {
		return cli.Fail(env, "bcrelease key", err)
	}
	if err := atomicfile.Write(*out, pem, 0o600); err != nil {
		return cli.Fail(env, "bcrelease key", err)
	}
	pin, _ := pki.Pin(k.Public())
	fmt.Fprintln(env.Stdout, pin)
	return 0
}

func makeCmd(_ context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcrelease", "make")
	version := fs.String("version", "", "the release's version (MAJOR.MINOR.PATCH[-pre])")
	seq := fs.Uint64("sequence", 0, "the release's sequence number: above every release before it")
	expires := fs.String("expires", "720h", "how long the manifest is good for (a Go duration) or when it expires (RFC 3339)")
	out := fs.String("out", "", "where to write the manifest (default stdout)")
	var arts listFlag
	fs.Var(&arts, "artifact", "ROLE/ARCH=FILE@URL: a built binary and where nodes fetch it; repeat for each")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	m := release.Manifest{Type: release.Type, Version: *version, Sequence: *seq}
	if d, err := time.ParseDuration(*expires); err == nil {
		m.Expires = time.Now().Add(d).UTC().Truncate(time.Second)
	} else if t, err := time.Parse(time.RFC3339, *expires); err == nil {
		m.Expires = t.UTC()
	} else {
		return cli.Usagef(env, "bcrelease make: --expires is neither a Go duration nor an RFC 3339 time")
	}
	for _, a := range arts {
		what, rest, ok1 := strings.Cut(a, "=")
		file, url, ok2 := strings.Cut(rest, "@")
		role, arch, ok3 := strings.Cut(what, "/")
		if !ok1 || !ok2 || !ok3 {
			return cli.Usagef(env, "bcrelease make: --artifact %q is not ROLE/ARCH=FILE@URL", a)
		}
		size, sum, err := digest(file)
		if err != nil {
			return cli.Fail(env, "bcrelease make", err)
		}
		m.Artifacts = append(m.Artifacts, release.Artifact{Role: role, Arch: arch, Size: size, SHA256: sum, URL: url})
	}
	doc, err := release.Encode(m)
	if err != nil {
		return cli.Fail(env, "bcrelease make", err)
	}
	return write(env, *out, doc)
}

func digest(file string) (int64, string, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, "", fmt.Errorf("reading %s: %w", file, err)
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

func write(env *cli.Env, out string, b []byte) int {
	b = append(b, '\n')
	if out == "" {
		env.Stdout.Write(b)
		return 0
	}
	if err := atomicfile.Write(out, b, 0o644); err != nil {
		return cli.Fail(env, "bcrelease", err)
	}
	return 0
}

func readDoc(in string) ([]byte, error) {
	if in == "" {
		return nil, errors.New("--in FILE is needed")
	}
	f, err := os.Open(in)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, release.MaxDocument+1))
}

func signCmd(_ context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcrelease", "sign")
	key := fs.String("key", "", "the release key (PEM)")
	in := fs.String("in", "", "the manifest")
	out := fs.String("out", "", "where to write the signed manifest (default: --in, replaced)")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	doc, err := readDoc(*in)
	if err != nil {
		return cli.Fail(env, "bcrelease sign", err)
	}
	kb, err := os.ReadFile(*key)
	if err != nil {
		return cli.Fail(env, "bcrelease sign", err)
	}
	k, err := pki.ParsePrivateKeyPEM(kb)
	if err != nil {
		return cli.Fail(env, "bcrelease sign", fmt.Errorf("--key: %w", err))
	}
	signed, err := release.Sign(doc, k)
	if err != nil {
		return cli.Fail(env, "bcrelease sign", err)
	}
	if *out == "" {
		*out = *in
	}
	pin, _ := pki.Pin(k.Public())
	fmt.Fprintf(env.Stderr, "bcrelease sign: signed with %s\n", pin)
	return write(env, *out, signed)
}

func verifyCmd(_ context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcrelease", "verify")
	in := fs.String("in", "", "the manifest")
	var pins listFlag
	fs.Var(&pins, "pin", "a pinned release key (sha256/...); repeat for each")
	threshold := fs.Int("threshold", 1, "how many pinned keys must sign")
	floor := fs.Uint64("floor", 0, "the release floor (the sequence of the release a node confirmed)")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	doc, err := readDoc(*in)
	if err != nil {
		return cli.Fail(env, "bcrelease verify", err)
	}
	m, err := release.Verify(doc, release.Policy{Pins: pins, Threshold: *threshold, Floor: *floor}, time.Now())
	if err != nil {
		return cli.Fail(env, "bcrelease verify", err)
	}
	fmt.Fprintf(env.Stdout, "release %s, sequence %d, expires %s\n", m.Version, m.Sequence, m.Expires.Format(time.RFC3339))
	for _, a := range m.Artifacts {
		fmt.Fprintf(env.Stdout, "  %s/%s %d bytes sha256 %s %s\n", a.Role, a.Arch, a.Size, a.SHA256, a.URL)
	}
	return 0
}
