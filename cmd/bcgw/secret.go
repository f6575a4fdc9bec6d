package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/better-compute/bcd/components/base/cli"
)

// maxSecretFile bounds what `bcgw secret set` reads: a header value is
// at most 8 KiB, and the gateway says so when it is longer.
const maxSecretFile = 16 << 10

// secretCmd is `bcgw secret set|delete|list`: the operator secrets agents
// ask for by name (a telemetry section's header values). A value is read
// from a file or stdin, never from arguments.
func secretCmd(ctx context.Context, env *cli.Env, args []string) int {
	const usage = "usage: bcgw secret set NAME [--node NODE] --value-file FILE|- | bcgw secret delete NAME [--node NODE] | bcgw secret list [--json]"
	if len(args) == 0 {
		return cli.Usagef(env, usage)
	}
	fs := cli.NewFlagSet(env, "bcgw", "secret "+args[0])
	var a adminFlags
	a.register(fs)
	node := fs.String("node", "", "the node the secret is for (default: every node of the fleet without its own)")
	valueFile := fs.String("value-file", "", "read the value from this file (- for stdin); a final newline is dropped")
	asJSON := fs.Bool("json", false, "list as JSON")
	npos := 1
	if args[0] == "list" {
		npos = 0
	}
	pos, code, ok := parseInterleaved(fs, env, args[1:], npos, usage[len("usage: "):])
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw secret", err)
	}
	switch args[0] {
	case "set":
		if *valueFile == "" {
			return cli.Usagef(env, "bcgw secret set: --value-file FILE (or - for stdin) is required; a value is never an argument")
		}
		v, err := readSecretValue(env, *valueFile)
		if err != nil {
			return cli.Fail(env, "bcgw secret set", err)
		}
		defer clear(v)
		name, err := c.SetSecret(ctx, pos[0], *node, v)
		if err != nil {
			return cli.Fail(env, "bcgw secret set", err)
		}
		fmt.Fprintf(env.Stdout, "set %s for %s\n", name, scope(*node))
	case "delete":
		name, err := c.DeleteSecret(ctx, pos[0], *node)
		if err != nil {
			return cli.Fail(env, "bcgw secret delete", err)
		}
		fmt.Fprintf(env.Stdout, "deleted %s for %s\n", name, scope(*node))
	case "list":
		vs, err := c.Secrets(ctx)
		if err != nil {
			return cli.Fail(env, "bcgw secret list", err)
		}
		if *asJSON {
			enc := json.NewEncoder(env.Stdout)
			enc.SetIndent("", "  ")
			return cliErr(env, enc.Encode(vs))
		}
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tFOR")
		for _, v := range vs {
			fmt.Fprintf(tw, "%s\t%s\n", v.Name, scope(v.Node))
		}
		return cliErr(env, tw.Flush())
	default:
		return cli.Usagef(env, usage)
	}
	return 0
}

func cliErr(env *cli.Env, err error) int {
	if err != nil {
		return cli.Fail(env, "bcgw secret", err)
	}
	return 0
}

func scope(node string) string {
	if node == "" {
		return "the fleet"
	}
	return "node " + node
}

// readSecretValue reads a value from path ("-": stdin), dropping one final
// newline (CRLF too). Errors name the file, never its contents.
func readSecretValue(env *cli.Env, path string) ([]byte, error) {
	var (
		b   []byte
		err error
	)
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(env.Stdin, maxSecretFile+1))
		if err == nil && len(b) > maxSecretFile {
			err = fmt.Errorf("stdin holds more than %d bytes", maxSecretFile)
		}
	} else {
		b, err = readSmallFile(path, maxSecretFile)
	}
	if err != nil {
		return nil, err
	}
	v := bytes.TrimSuffix(b, []byte("\n"))
	v = bytes.TrimSuffix(v, []byte("\r"))
	if len(v) == 0 {
		return nil, fmt.Errorf("the value in %s is empty", path)
	}
	return v, nil
}
