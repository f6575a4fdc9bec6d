package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/vm/snapshot"
)

const snapshotUsage = `bcgw snapshot NODE INSTANCE --to https://URL [--memory] [--deadline D] [--timeout D]`

// snapshotCmd is `bcgw snapshot NODE INSTANCE --to URL [--memory]`: an
// instance.snapshot of the instance (its disk, and with --memory its
// memory) PUT to the presigned https URL, waiting for the result, which
// carries the archive's size and SHA-256 (restore_from's sha256). The URL
// goes only into the command's body: nothing bcgw prints carries it.
func snapshotCmd(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "snapshot")
	var a adminFlags
	a.register(fs)
	to := fs.String("to", "", "the presigned https URL the snapshot is PUT to")
	memory := fs.Bool("memory", false, "the instance's memory too (it resumes from it; restores only into the same vCPUs, memory and CPU)")
	deadline := fs.Duration("deadline", time.Hour, "the command's deadline (bounds the upload)")
	timeout := fs.Duration("timeout", time.Hour, "how long to wait for the result")
	pos, code, ok := parseInterleaved(fs, env, args, 2, snapshotUsage)
	if !ok {
		return code
	}
	if *to == "" {
		return cli.Usagef(env, "bcgw snapshot: --to is missing\nusage: %s", snapshotUsage)
	}
	if err := checkDeadline(*deadline); err != nil {
		return cli.Usagef(env, "bcgw snapshot: --deadline: %v", err)
	}
	body, _ := json.Marshal(map[string]any{"instance": pos[1], "memory": *memory, "url": *to})
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw snapshot", err)
	}
	cmd, err := c.Send(ctx, adminapi.CommandRequest{Node: pos[0], Kind: snapshot.Kind, Body: body, DeadlineSeconds: int(deadline.Seconds())})
	if err != nil {
		return cli.Fail(env, "bcgw snapshot", err)
	}
	return waitResult(ctx, env, c, cmd, *timeout, "bcgw snapshot")
}
