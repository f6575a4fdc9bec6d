package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/pki"
)

const batchUsage = "usage: bcgw batch create --id ID [--expires D] (--command FILE ... | --commands-from DIR) | " +
	"bcgw batch approve --key APPROVER.key.pem [--file FILE] | bcgw batch submit [--file FILE] [--wait] [--timeout D]  (FILE may be - for stdin)"

// batchCmd is `bcgw batch create|approve|submit`: destructive commands as
// a batch the approvers approve (components/trust/quorum).
func batchCmd(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) == 0 {
		return cli.Usagef(env, "%s", batchUsage)
	}
	switch args[0] {
	case "create":
		return batchCreate(env, args[1:])
	case "approve":
		return batchApprove(env, args[1:])
	case "submit":
		return batchSubmit(ctx, env, args[1:])
	default:
		return cli.Usagef(env, "%s", batchUsage)
	}
}

// batchCreate builds a batch of prepared commands and prints it. It
// needs no data directory and no gateway.
func batchCreate(env *cli.Env, args []string) int {
	const prefix = "bcgw batch create"
	fs := cli.NewFlagSet(env, "bcgw", "batch create")
	id := fs.String("id", "", "the batch id (1 to 128 of A-Z a-z 0-9 . _ : -); agents run each leaf of a batch id once, so never reuse one")
	expires := fs.Duration("expires", time.Hour, "how long the batch may run after now; approvals and submission must happen within it")
	var files stringsFlag
	fs.Var(&files, "command", "a prepared command (bcgw run --prepare, signed or not); repeat for each, in the batch's order")
	dir := fs.String("commands-from", "", "a directory of prepared commands: every *.json in it, in name order")
	if code, ok := cli.Parse(fs, env, args, "prints the batch file; says on stderr what it holds"); !ok {
		return code
	}
	switch {
	case *id == "":
		return cli.Usagef(env, "%s: --id is required\n%s", prefix, batchUsage)
	case (len(files) == 0) == (*dir == ""):
		return cli.Usagef(env, "%s: give --command FILE (repeated) or --commands-from DIR, one of the two\n%s", prefix, batchUsage)
	case *expires <= 0:
		return cli.Usagef(env, "%s: --expires must be positive", prefix)
	}
	if *dir != "" {
		entries, err := os.ReadDir(*dir)
		if err != nil {
			return cli.Fail(env, prefix, fmt.Errorf("--commands-from: %w", err))
		}
		for _, e := range entries { // in name order
			if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".json") {
				files = append(files, filepath.Join(*dir, e.Name()))
			}
		}
		if len(files) == 0 {
			return cli.Fail(env, prefix, fmt.Errorf("--commands-from: %s holds no *.json file", *dir))
		}
	}
	cmds := make([]adminapi.PreparedCommand, len(files))
	for i, f := range files {
		b, err := readSmallFile(f, 16<<20)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		c, _, err := adminapi.DecodePrepared(b)
		if err == nil && c == nil {
			err = errors.New("a prepared spec; a batch holds commands (bcgw run --prepare)")
		}
		if err != nil {
			return cli.Fail(env, prefix, fmt.Errorf("%s: %w", f, err))
		}
		cmds[i] = *c
	}
	now := time.Now()
	bf, err := adminapi.BuildBatch(*id, cmds, now.Add(*expires), now)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	fmt.Fprintf(env.Stderr, "%s: %s", prefix, bf.Describe(now))
	fmt.Fprintf(env.Stderr, "%s: have it approved (bcgw batch approve, where each approver's key is), then bcgw batch submit\n", prefix)
	return printJSON(env, bf)
}

// batchApprove adds an approver's approval to a batch file. It runs
// where the key is, with no data directory and no gateway; the key is
// read from its file (which only its owner may read), never printed or
// logged.
func batchApprove(env *cli.Env, args []string) int {
	const prefix = "bcgw batch approve"
	fs := cli.NewFlagSet(env, "bcgw", "batch approve")
	keyPath := fs.String("key", "", "the approver's key: a PKCS#8 PEM \"PRIVATE KEY\" file (ECDSA P-256) only its owner may read")
	in := fs.String("file", "-", "the batch file (bcgw batch create); - reads stdin")
	fs.StringVar(in, "in", "-", "the same as --file (deprecated)")
	if code, ok := cli.Parse(fs, env, args, "prints the batch file with this key's approval; says on stderr what it approves"); !ok {
		return code
	}
	if *keyPath == "" {
		return cli.Usagef(env, "%s: --key is required\n%s", prefix, batchUsage)
	}
	b, err := readInput(env, *in, adminapi.MaxBatchFile)
	if err != nil {
		return cli.Fail(env, prefix, fmt.Errorf("--file: %w", err))
	}
	now := time.Now()
	bf, err := adminapi.DecodeBatch(b)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	key, err := adminapi.ReadSigningKey(*keyPath)
	if err != nil {
		return cli.Fail(env, prefix, fmt.Errorf("--key: %w", err))
	}
	pin, err := pki.Pin(key.Public())
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	fmt.Fprintf(env.Stderr, "%s: %s", prefix, bf.Describe(now))
	bf, err = adminapi.ApproveBatch(key, b, now)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	fmt.Fprintf(env.Stderr, "%s: approved batch %s (%d commands), with the key %s; it carries %d approvals\n",
		prefix, bf.HeaderView.BatchID, bf.HeaderView.Count, pin, len(bf.Approvals))
	return printJSON(env, bf)
}

// batchSubmit sends every command of an approved batch with its leaf.
func batchSubmit(ctx context.Context, env *cli.Env, args []string) int {
	const prefix = "bcgw batch submit"
	fs := cli.NewFlagSet(env, "bcgw", "batch submit")
	var a adminFlags
	a.register(fs)
	in := fs.String("file", "-", "the approved batch file; - reads stdin")
	fs.StringVar(in, "in", "-", "the same as --file (deprecated)")
	wait := fs.Bool("wait", false, "wait for every command's result")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait, how long to wait for all of them")
	if code, ok := cli.Parse(fs, env, args, "prints the commands' views as a JSON array"); !ok {
		return code
	}
	b, err := readInput(env, *in, adminapi.MaxBatchFile)
	if err != nil {
		return cli.Fail(env, prefix, fmt.Errorf("--file: %w", err))
	}
	bf, err := adminapi.DecodeBatch(b)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	v, err := c.SubmitBatch(ctx, bf)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if v.Warning != "" {
		fmt.Fprintf(env.Stderr, "%s: warning: %s\n", prefix, v.Warning)
	}
	for _, cv := range v.Commands {
		if cv.Warning != "" {
			fmt.Fprintf(env.Stderr, "%s: warning: %s (%s for %s): %s\n", prefix, cv.ID, cv.Kind, cv.Node, cv.Warning)
		}
	}
	if !*wait {
		return printJSON(env, v.Commands)
	}
	end := time.Now().Add(*timeout)
	views := v.Commands
	var failed []string
	for i := range views {
		for views[i].State != "done" {
			left := time.Until(end)
			if left <= 0 {
				break
			}
			cv, err := c.Command(ctx, views[i].ID, min(left, 2*time.Second))
			if err != nil {
				printJSON(env, views)
				return cli.Fail(env, prefix, err)
			}
			views[i] = cv
		}
		switch {
		case views[i].State != "done":
			failed = append(failed, fmt.Sprintf("%s: no result within %s", views[i].ID, *timeout))
		case views[i].Status != "SUCCEEDED":
			failed = append(failed, fmt.Sprintf("%s: %s %s", views[i].ID, views[i].Status, views[i].Error))
		}
	}
	printJSON(env, views)
	if len(failed) > 0 {
		return cli.Fail(env, prefix, fmt.Errorf("%d of %d commands did not succeed:\n  %s", len(failed), len(views), strings.Join(failed, "\n  ")))
	}
	return 0
}
