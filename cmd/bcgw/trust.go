package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/trust/pki"
)

const trustUsage = "usage: bcgw trust show [--json] | bcgw trust add-root --key PUB.pem | bcgw trust remove-root --key PUB.pem"

// trustCmd is `bcgw trust show|add-root|remove-root`.
func trustCmd(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) == 0 {
		return cli.Usagef(env, "%s", trustUsage)
	}
	verb := args[0]
	prefix := "bcgw trust " + verb
	fs := cli.NewFlagSet(env, "bcgw", "trust "+verb)
	var a adminFlags
	a.register(fs)
	switch verb {
	case "show":
		asJSON := fs.Bool("json", false, "print the trust view as JSON")
		if code, ok := cli.Parse(fs, env, args[1:], ""); !ok {
			return code
		}
		c, err := a.client()
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		v, err := c.Trust(ctx)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		if *asJSON {
			return printJSON(env, v)
		}
		writeTrust(env.Stdout, v)
		return 0
	case "add-root", "remove-root":
		key := fs.String("key", "", "the root's public key: a PEM \"PUBLIC KEY\" file (ECDSA P-256)")
		asJSON := fs.Bool("json", false, "print {\"version\", \"changed\", \"pin\", \"roots\"} instead of the version")
		if code, ok := cli.Parse(fs, env, args[1:], ""); !ok {
			return code
		}
		if *key == "" {
			return cli.Usagef(env, "%s: --key is required\n%s", prefix, trustUsage)
		}
		b, err := readSmallFile(*key, 64<<10)
		if err != nil {
			return cli.Fail(env, prefix, fmt.Errorf("--key: %w", err))
		}
		spki, err := gateway.ParsePublicKeyPEM(b)
		if err != nil {
			return cli.Fail(env, prefix, fmt.Errorf("--key %s: %w", *key, err))
		}
		c, err := a.client()
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		var ch gateway.TrustChange
		if verb == "add-root" {
			ch, err = c.AddTrustRoot(ctx, spki)
		} else {
			ch, err = c.RemoveTrustRoot(ctx, spki)
		}
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		switch {
		case !ch.Changed:
			fmt.Fprintf(env.Stderr, "%s: %s is a root already; the trust bundle is unchanged\n", prefix, ch.Pin)
		case ch.Roots == 0:
			fmt.Fprintf(env.Stderr, "%s: the trust bundle names no command-signing root now: agents that take it no longer enforce signed intent\n", prefix)
		}
		if *asJSON {
			return printJSON(env, ch)
		}
		fmt.Fprintln(env.Stdout, ch.Version)
		return 0
	default:
		return cli.Usagef(env, "%s", trustUsage)
	}
}

// writeTrust prints the trust view for people.
func writeTrust(w io.Writer, v gateway.TrustView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "version\t%d\n", v.Version)
	switch {
	case v.OwnKey == "":
		fmt.Fprintf(tw, "own key\tnone (--command-key none): bcgw signs nothing\n")
	case v.OwnKeyIsRoot:
		fmt.Fprintf(tw, "own key\t%s (a root)\n", v.OwnKey)
	default:
		fmt.Fprintf(tw, "own key\t%s (not a root: what bcgw signs itself is refused by agents that enforce)\n", v.OwnKey)
	}
	if len(v.Roots) == 0 {
		fmt.Fprintf(tw, "roots\tnone: signed intent is not enforced\n")
		tw.Flush()
	} else {
		fmt.Fprintf(tw, "roots\t%d\n", len(v.Roots))
		tw.Flush()
		for _, r := range v.Roots {
			own := ""
			if r.Own {
				own = "  (bcgw's own key)"
			}
			fmt.Fprintf(w, "  %s%s\n", r.Pin, own)
		}
	}
	if len(v.Nodes) == 0 {
		return
	}
	fmt.Fprintln(w, "\nnodes")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODE\tCONNECTED\tHOLDS\tSINCE")
	for _, n := range v.Nodes {
		holds, since := "-", "-"
		if n.TrustVersion > 0 {
			holds = fmt.Sprint(n.TrustVersion)
		}
		if n.At != nil {
			since = stamp(*n.At)
		}
		fmt.Fprintf(tw, "  %s\t%v\t%s\t%s\n", n.Node, n.Connected, holds, since)
	}
	tw.Flush()
}

// signCmd is `bcgw sign --key KEY.pem [--in FILE]`: it signs a prepared
// command or spec on the key holder's machine. It needs no data
// directory and no gateway. The key is read from its file (which only its
// owner may read), never from arguments, and never printed or logged.
func signCmd(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "sign")
	keyPath := fs.String("key", "", "the command-signing key: a PKCS#8 PEM \"PRIVATE KEY\" file (ECDSA P-256) only its owner may read")
	in := fs.String("in", "-", "the prepared command (bcgw run --prepare) or spec (bcgw spec prepare); - reads stdin")
	if code, ok := cli.Parse(fs, env, args, "prints the prepared JSON with its signature; says on stderr what it signed"); !ok {
		return code
	}
	if *keyPath == "" {
		return cli.Usagef(env, "bcgw sign: --key is required\nusage: bcgw sign --key KEY.pem [--in FILE]")
	}
	var b []byte
	var err error
	if *in == "-" {
		b, err = io.ReadAll(io.LimitReader(env.Stdin, 16<<20))
	} else {
		b, err = readSmallFile(*in, 16<<20)
	}
	if err != nil {
		return cli.Fail(env, "bcgw sign", fmt.Errorf("--in: %w", err))
	}
	key, err := gateway.ReadSigningKey(*keyPath)
	if err != nil {
		return cli.Fail(env, "bcgw sign", fmt.Errorf("--key: %w", err))
	}
	out, what, err := gateway.SignPrepared(key, b)
	if err != nil {
		return cli.Fail(env, "bcgw sign", err)
	}
	pin, err := pki.Pin(key.Public())
	if err != nil {
		return cli.Fail(env, "bcgw sign", err)
	}
	fmt.Fprintf(env.Stderr, "bcgw sign: signed %s, with the key %s\n", what, pin)
	return printJSON(env, out)
}
