package main

import (
	"context"
	"fmt"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// hold is `bcgw hold NODE --alloc ID --gpu N|UUID|MIG-UUID|N/giG/ciC|N/slotS
// ... [--cpus L] [--memory BYTES] [--hugepages-2m N]`: a hold added to (or replaced in) the node's devices
// section, as a new spec generation.
func hold(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "hold")
	var a adminFlags
	a.register(fs)
	alloc := fs.String("alloc", "", "the allocation id ([A-Za-z0-9_-], 1 to 128)")
	var gpus stringsFlag
	fs.Var(&gpus, "gpu", "what to hold: a whole GPU (index or GPU-UUID), a MIG instance (MIG-UUID or GPU/giG/ciC) or a slot of a shared GPU (GPU/slotS); repeat for each")
	cpus := fs.String("cpus", "", "limit the allocation to these CPUs (a cpulist, e.g. 0-7)")
	memory := fs.Uint64("memory", 0, "limit the allocation's memory, in bytes")
	huge := fs.Int64("hugepages-2m", 0, "huge pages of 2 MiB the allocation needs (admitted against the host's)")
	asJSON := fs.Bool("json", false, "print {\"generation\": N}")
	const usage = "bcgw hold NODE --alloc ID --gpu N|UUID|MIG-UUID|N/giG/ciC|N/slotS ... [--cpus LIST] [--memory BYTES] [--hugepages-2m N] [--json]"
	pos, code, ok := parseInterleaved(fs, env, args, 1, usage)
	if !ok {
		return code
	}
	if *alloc == "" || len(gpus) == 0 {
		return cli.Usagef(env, "bcgw hold: --alloc and at least one --gpu are needed\nusage: %s", usage)
	}
	h := adminapi.HoldRequest{Allocation: *alloc, GPUs: gpus}
	if *cpus != "" || *memory != 0 || *huge != 0 {
		h.Limits = &adminapi.HoldLimits{CPUs: *cpus, MemoryBytes: *memory, HugePages2M: *huge}
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw hold", err)
	}
	gen, err := c.Hold(ctx, pos[0], h)
	if err != nil {
		return cli.Fail(env, "bcgw hold", err)
	}
	if *asJSON {
		return printJSON(env, adminapi.GenerationView{Generation: gen})
	}
	fmt.Fprintf(env.Stdout, "%d\n", gen)
	return 0
}

// release is `bcgw release NODE --alloc ID`.
func release(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "release")
	var a adminFlags
	a.register(fs)
	alloc := fs.String("alloc", "", "the allocation whose hold goes")
	asJSON := fs.Bool("json", false, "print {\"generation\": N}")
	const usage = "bcgw release NODE --alloc ID [--json]"
	pos, code, ok := parseInterleaved(fs, env, args, 1, usage)
	if !ok {
		return code
	}
	if *alloc == "" {
		return cli.Usagef(env, "bcgw release: --alloc is needed\nusage: %s", usage)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw release", err)
	}
	gen, err := c.Release(ctx, pos[0], *alloc)
	if err != nil {
		return cli.Fail(env, "bcgw release", err)
	}
	if *asJSON {
		return printJSON(env, adminapi.GenerationView{Generation: gen})
	}
	fmt.Fprintf(env.Stdout, "%d\n", gen)
	return 0
}
