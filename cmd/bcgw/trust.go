package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/pki"
)

const trustUsage = "usage: bcgw trust show [--json] | bcgw trust add-root --key PUB.pem | bcgw trust remove-root --key PUB.pem | " +
	"bcgw trust rotate-key [--json] | bcgw trust approvers propose|endorse|set ..."

// trustCmd is `bcgw trust show|add-root|remove-root|approvers`.
func trustCmd(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) == 0 {
		return cli.Usagef(env, "%s", trustUsage)
	}
	verb := args[0]
	if verb == "approvers" {
		return approversCmd(ctx, env, args[1:])
	}
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
		spki, err := adminapi.ParsePublicKeyPEM(b)
		if err != nil {
			return cli.Fail(env, prefix, fmt.Errorf("--key %s: %w", *key, err))
		}
		c, err := a.client()
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		var ch adminapi.TrustChange
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
	case "rotate-key":
		asJSON := fs.Bool("json", false, "print {\"old_pin\", \"new_pin\", \"version\", \"old_public_key\"}")
		if code, ok := cli.Parse(fs, env, args[1:], ""); !ok {
			return code
		}
		c, err := a.client()
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		r, err := c.RotateCommandKey(ctx)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		if *asJSON {
			return printJSON(env, r)
		}
		fmt.Fprintf(env.Stdout, "%d\n", r.Version)
		fmt.Fprintf(env.Stderr, "%s: bcgw signs with %s now; %s stays a root for the commands it signed. Once they are done:\n"+
			"  bcgw trust remove-root --key %s\n", prefix, r.NewPin, r.OldPin, r.OldPublicKey)
		return 0
	default:
		return cli.Usagef(env, "%s", trustUsage)
	}
}

// writeTrust prints the trust view for people.
func writeTrust(w io.Writer, v adminapi.TrustView) {
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
	writeApprovers(w, v.Approvers)
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

// signCmd is `bcgw sign --key KEY.pem [--file FILE]`: it signs a prepared
// command or spec on the key holder's machine. It needs no data
// directory and no gateway. The key is read from its file (which only its
// owner may read), never from arguments, and never printed or logged.
func signCmd(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "sign")
	keyPath := fs.String("key", "", "the command-signing key: a PKCS#8 PEM \"PRIVATE KEY\" file (ECDSA P-256) only its owner may read")
	in := fs.String("file", "-", "the prepared command (bcgw run --prepare) or spec (bcgw spec prepare); - reads stdin")
	fs.StringVar(in, "in", "-", "the same as --file (deprecated)")
	if code, ok := cli.Parse(fs, env, args, "prints the prepared JSON with its signature; says on stderr what it signed"); !ok {
		return code
	}
	if *keyPath == "" {
		return cli.Usagef(env, "bcgw sign: --key is required\nusage: bcgw sign --key KEY.pem [--file FILE]")
	}
	var b []byte
	var err error
	if *in == "-" {
		b, err = io.ReadAll(io.LimitReader(env.Stdin, 16<<20))
	} else {
		b, err = readSmallFile(*in, 16<<20)
	}
	if err != nil {
		return cli.Fail(env, "bcgw sign", fmt.Errorf("--file: %w", err))
	}
	key, err := adminapi.ReadSigningKey(*keyPath)
	if err != nil {
		return cli.Fail(env, "bcgw sign", fmt.Errorf("--key: %w", err))
	}
	out, what, err := adminapi.SignPrepared(key, b)
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

// writeApprovers prints the trust bundle's approver set for people.
func writeApprovers(w io.Writer, a *adminapi.ApproversView) {
	if a == nil {
		fmt.Fprintf(w, "\napprovers  none: agents run destructive commands without a batch\n")
		return
	}
	fmt.Fprintf(w, "\napprovers  epoch %d: %d of %d keys approve a batch; %d endorsements\n", a.Epoch, a.Threshold, len(a.Keys), a.Endorsements)
	for _, k := range a.Keys {
		fmt.Fprintf(w, "  %s\n", k)
	}
}

const approversUsage = "usage: bcgw trust approvers propose --threshold K --key A.pub.pem --key B.pub.pem ... [--epoch N] | " +
	"bcgw trust approvers endorse --key APPROVER.key.pem [--file FILE] | bcgw trust approvers set [--file FILE] [--json]  (FILE may be - for stdin)"

// approversCmd is `bcgw trust approvers propose|endorse|set`: the
// approver set of the destructive-batch quorum.
func approversCmd(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) == 0 {
		return cli.Usagef(env, "%s", approversUsage)
	}
	verb := args[0]
	prefix := "bcgw trust approvers " + verb
	fs := cli.NewFlagSet(env, "bcgw", "trust approvers "+verb)
	switch verb {
	case "propose":
		var a adminFlags
		a.register(fs)
		threshold := fs.Int("threshold", 0, "how many of the keys must approve a batch")
		epoch := fs.Uint64("epoch", 0, "the set's epoch (default: the held set's epoch plus one)")
		var keys stringsFlag
		fs.Var(&keys, "key", "an approver's public key: a PEM \"PUBLIC KEY\" file (ECDSA P-256); repeat for each approver")
		if code, ok := cli.Parse(fs, env, args[1:], "prints the proposed set; nothing changes"); !ok {
			return code
		}
		if len(keys) == 0 || *threshold == 0 {
			return cli.Usagef(env, "%s: --threshold and at least one --key are required\n%s", prefix, approversUsage)
		}
		spkis := make([][]byte, len(keys))
		for i, k := range keys {
			b, err := readSmallFile(k, 64<<10)
			if err != nil {
				return cli.Fail(env, prefix, fmt.Errorf("--key: %w", err))
			}
			if spkis[i], err = adminapi.ParseApproverKeyPEM(b); err != nil {
				return cli.Fail(env, prefix, fmt.Errorf("--key %s: %w", k, err))
			}
		}
		c, err := a.client()
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		v, err := c.Trust(ctx)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		var held uint64
		if v.Approvers != nil {
			held = v.Approvers.Epoch
		}
		set, err := adminapi.ProposeApprovers(held, *epoch, *threshold, spkis)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		if v.Approvers == nil {
			fmt.Fprintf(env.Stderr, "%s: epoch %d, %d of %d keys; the trust bundle holds no approver set, so agents take this one as it is: no endorsement is needed (bcgw trust approvers set)\n",
				prefix, set.Epoch, set.Threshold, len(set.Keys))
		} else {
			fmt.Fprintf(env.Stderr, "%s: epoch %d, %d of %d keys; agents holding the set of epoch %d take it once %d of that set's keys endorsed it (bcgw trust approvers endorse, then bcgw trust approvers set)\n",
				prefix, set.Epoch, set.Threshold, len(set.Keys), v.Approvers.Epoch, v.Approvers.Threshold)
		}
		return printJSON(env, set)
	case "endorse":
		keyPath := fs.String("key", "", "the approver's key: a PKCS#8 PEM \"PRIVATE KEY\" file (ECDSA P-256) only its owner may read")
		in := fs.String("file", "-", "the proposed set (bcgw trust approvers propose); - reads stdin")
		fs.StringVar(in, "in", "-", "the same as --file (deprecated)")
		if code, ok := cli.Parse(fs, env, args[1:], "prints the set with this key's endorsement; says on stderr what it endorsed"); !ok {
			return code
		}
		if *keyPath == "" {
			return cli.Usagef(env, "%s: --key is required\n%s", prefix, approversUsage)
		}
		b, err := readInput(env, *in, 1<<20)
		if err != nil {
			return cli.Fail(env, prefix, fmt.Errorf("--file: %w", err))
		}
		key, err := adminapi.ReadSigningKey(*keyPath)
		if err != nil {
			return cli.Fail(env, prefix, fmt.Errorf("--key: %w", err))
		}
		set, what, err := adminapi.EndorseApprovers(key, b)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		pin, err := pki.Pin(key.Public())
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		fmt.Fprintf(env.Stderr, "%s: endorsed %s, with the key %s\n", prefix, what, pin)
		fmt.Fprintf(env.Stderr, "%s: the set's keys:\n", prefix)
		for _, k := range set.Keys {
			fmt.Fprintf(env.Stderr, "  %s\n", spkiPin(k))
		}
		return printJSON(env, set)
	case "set":
		var a adminFlags
		a.register(fs)
		in := fs.String("file", "-", "the set (bcgw trust approvers propose, endorsed); - reads stdin")
		fs.StringVar(in, "in", "-", "the same as --file (deprecated)")
		asJSON := fs.Bool("json", false, "print {\"version\", \"changed\", \"epoch\", \"threshold\", \"keys\", \"endorsements\", \"warning\"} instead of the version")
		if code, ok := cli.Parse(fs, env, args[1:], ""); !ok {
			return code
		}
		b, err := readInput(env, *in, 1<<20)
		if err != nil {
			return cli.Fail(env, prefix, fmt.Errorf("--file: %w", err))
		}
		set, err := adminapi.DecodeApproverSet(b)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		c, err := a.client()
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		ch, err := c.SetApprovers(ctx, set)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		if !ch.Changed {
			fmt.Fprintf(env.Stderr, "%s: the trust bundle holds this set already; it is unchanged\n", prefix)
		}
		if ch.Warning != "" {
			fmt.Fprintf(env.Stderr, "%s: warning: %s\n", prefix, ch.Warning)
		}
		if *asJSON {
			return printJSON(env, ch)
		}
		fmt.Fprintln(env.Stdout, ch.Version)
		return 0
	default:
		return cli.Usagef(env, "%s", approversUsage)
	}
}

// spkiPin is the pin of an SPKI DER ("(unparseable key)" when it is
// not one).
func spkiPin(spki []byte) string {
	pub, err := x509.ParsePKIXPublicKey(spki)
	if err != nil {
		return "(unparseable key)"
	}
	p, err := pki.Pin(pub)
	if err != nil {
		return "(unparseable key)"
	}
	return p
}

// stringsFlag collects a repeated flag's values.
type stringsFlag []string

func (f *stringsFlag) String() string { return fmt.Sprint(len(*f)) }

func (f *stringsFlag) Set(v string) error {
	*f = append(*f, v)
	return nil
}

// readInput reads a file of at most limit bytes, or stdin for "-".
func readInput(env *cli.Env, path string, limit int64) ([]byte, error) {
	if path != "-" {
		return readSmallFile(path, limit)
	}
	b, err := io.ReadAll(io.LimitReader(env.Stdin, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("stdin holds more than %d bytes", limit)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("stdin is empty")
	}
	return b, nil
}
