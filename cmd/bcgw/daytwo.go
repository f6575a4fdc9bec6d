package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/store"
)

// tokenLsRm is `bcgw token ls [--json]` and `bcgw token rm ID`.
func tokenLsRm(ctx context.Context, env *cli.Env, args []string) int {
	verb := args[0]
	prefix := "bcgw token " + verb
	fs := cli.NewFlagSet(env, "bcgw", "token "+verb)
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	npos, usage := 0, "bcgw token ls [--json]"
	if verb == "rm" {
		npos, usage = 1, "bcgw token rm ID [--json]"
	}
	pos, code, ok := parseInterleaved(fs, env, args[1:], npos, usage)
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if verb == "rm" {
		if err := c.RemoveJoinToken(ctx, pos[0]); err != nil {
			return cli.Fail(env, prefix, err)
		}
		if *asJSON {
			return printJSON(env, map[string]string{"removed": pos[0]})
		}
		fmt.Fprintf(env.Stdout, "removed join token %s\n", pos[0])
		return 0
	}
	ts, err := c.JoinTokens(ctx)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if *asJSON {
		return printJSON(env, ts)
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN\tROLE\tSITE\tUSED\tCREATED\tEXPIRES\tSTATE\tFOR")
	for _, t := range ts {
		state := "usable"
		switch {
		case t.Spent:
			state = "spent"
		case t.Expired:
			state = "expired"
		}
		exp := "never"
		if !t.ExpiresAt.IsZero() {
			exp = stamp(t.ExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", t.ID, t.Role, t.Site, t.Used, t.Uses, stamp(t.CreatedAt), exp, state,
			orDash(t.NodeID+t.MAC))
	}
	tw.Flush()
	return 0
}

// nodeCmd is `bcgw node rm NODE [--json]`.
func nodeCmd(ctx context.Context, env *cli.Env, args []string) int {
	const usage = "bcgw node rm NODE [--json]"
	if len(args) == 0 || args[0] != "rm" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(env.Stderr, "usage: "+usage)
			return 0
		}
		return cli.Usagef(env, "usage: %s", usage)
	}
	fs := cli.NewFlagSet(env, "bcgw", "node rm")
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, code, ok := parseInterleaved(fs, env, args[1:], 1, usage)
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw node rm", err)
	}
	if err := c.RemoveNode(ctx, pos[0]); err != nil {
		return cli.Fail(env, "bcgw node rm", err)
	}
	if *asJSON {
		return printJSON(env, map[string]string{"removed": pos[0]})
	}
	fmt.Fprintf(env.Stdout, "removed node %s\n", pos[0])
	return 0
}

// backup is `bcgw backup --out FILE [--json]`: a consistent copy of a
// bbolt gateway's store, taken while it serves, in a new 0600 file that
// is checked to open as a bcgw store.
func backup(ctx context.Context, env *cli.Env, args []string) int {
	const prefix = "bcgw backup"
	fs := cli.NewFlagSet(env, "bcgw", "backup")
	var a adminFlags
	a.register(fs)
	out := fs.String("out", "", "the new file to write the copy of bcgw.db to (mode 0600; it must not exist)")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	if *out == "" {
		return cli.Usagef(env, "%s: --out FILE is required", prefix)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	n, err := c.Backup(ctx, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = store.CheckBolt(*out)
	}
	if err != nil {
		os.Remove(*out)
		return cli.Fail(env, prefix, err)
	}
	if *asJSON {
		return printJSON(env, map[string]any{"file": *out, "bytes": n})
	}
	fmt.Fprintf(env.Stdout, "%s\n", *out)
	fmt.Fprintf(env.Stderr, "%s: %d bytes; keep it with a copy of the data directory's key files (docs/gateway-store.md)\n", prefix, n)
	return 0
}

// servingCert is `bcgw serving-cert renew [--json]`: the gateway issues
// itself a new serving leaf under its serving CA, presented from the next
// TLS handshake on.
func servingCert(ctx context.Context, env *cli.Env, args []string) int {
	const usage = "bcgw serving-cert renew [--json]"
	if len(args) == 0 || args[0] != "renew" {
		return cli.Usagef(env, "usage: %s", usage)
	}
	fs := cli.NewFlagSet(env, "bcgw", "serving-cert renew")
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print {\"serial\", \"not_before\", \"not_after\"}")
	if _, code, ok := parseInterleaved(fs, env, args[1:], 0, usage); !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw serving-cert renew", err)
	}
	v, err := c.RenewServing(ctx)
	if err != nil {
		return cli.Fail(env, "bcgw serving-cert renew", err)
	}
	if *asJSON {
		return printJSON(env, v)
	}
	fmt.Fprintf(env.Stdout, "serving certificate %s, valid until %s\n", v.Serial, stamp(v.NotAfter))
	return 0
}
