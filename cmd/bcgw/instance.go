package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/vm/spec"
)

const instanceUsage = `bcgw instance add NODE --id ID --alloc A --image SHA256=https://URL|--restore-from SHA256=https://URL [--restore-memory] [--format qcow2|raw|iso] [--spki-pin sha256/...] [--vcpus N] [--memory-mib N] [--disk-gib N] [--state RUNNING|PAUSED|STOPPED] [--hostname H] [--user-data] [--gpu GPU-UUID ...]
bcgw instance state NODE --id ID --state RUNNING|PAUSED|STOPPED
bcgw instance remove NODE --id ID`

// instanceCmd is `bcgw instance add|state|remove NODE ...`: one instance
// of the node's instances section added (or replaced), put in a state or
// removed, as a new spec generation. It reads the held spec, changes the
// section, checks it as the node will and sends it as a merge patch of
// that section alone.
func instanceCmd(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) == 0 || !slices.Contains([]string{"add", "state", "remove"}, args[0]) {
		return cli.Usagef(env, "usage: %s", instanceUsage)
	}
	verb := args[0]
	name := "bcgw instance " + verb
	fs := cli.NewFlagSet(env, "bcgw", "instance "+verb)
	var a adminFlags
	a.register(fs)
	id := fs.String("id", "", "the instance id ([A-Za-z0-9][A-Za-z0-9_-], 1 to 64)")
	state := fs.String("state", "", "RUNNING, PAUSED or STOPPED (add: RUNNING when not given)")
	var in spec.Instance
	var image, format, pin, restore string
	var restoreMemory bool
	var gpus stringsFlag
	if verb == "add" {
		fs.StringVar(&in.Allocation, "alloc", "", "the allocation the instance belongs to")
		fs.StringVar(&image, "image", "", "the base image: SHA256=https://URL")
		fs.StringVar(&restore, "restore-from", "", "start from a snapshot instead of an image: SHA256=https://URL (bcgw snapshot's sha256 and where it went)")
		fs.BoolVar(&restoreMemory, "restore-memory", false, "with --restore-from, resume the snapshot's memory (same vCPUs, memory and CPU only)")
		fs.StringVar(&format, "format", spec.QCOW2, "the base image's format: qcow2, raw or iso")
		fs.StringVar(&pin, "spki-pin", "", "pin the image server's key (sha256/<base64>) instead of the system roots")
		fs.IntVar(&in.VCPUs, "vcpus", 1, "vCPUs")
		fs.IntVar(&in.MemoryMiB, "memory-mib", 512, "memory in MiB")
		fs.IntVar(&in.DiskGiB, "disk-gib", 0, "the disk's size in GiB (0: the base image's)")
		fs.StringVar(&in.Hostname, "hostname", "", "the seed's local-hostname")
		fs.BoolVar(&in.UserData, "user-data", false, "put the allocation's user data into the seed")
		fs.Var(&gpus, "gpu", "a GPU passed through (GPU-UUID); repeat for each")
	}
	pos, code, ok := parseInterleaved(fs, env, args[1:], 1, instanceUsage)
	if !ok {
		return code
	}
	if *id == "" || verb == "state" && *state == "" || verb == "add" && (in.Allocation == "" || (image == "") == (restore == "")) {
		return cli.Usagef(env, "%s: missing flags\nusage: %s", name, instanceUsage)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, name, err)
	}
	held, err := c.Spec(ctx, pos[0])
	if err != nil {
		return cli.Fail(env, name, err)
	}
	var sections map[string]json.RawMessage
	if len(held.Spec) > 0 {
		if err := json.Unmarshal(held.Spec, &sections); err != nil {
			return cli.Fail(env, name, fmt.Errorf("the held spec does not read: %w", err))
		}
	}
	body, err := spec.Decode(sections["instances"])
	if err != nil {
		return cli.Fail(env, name, fmt.Errorf("the held instances section: %w", err))
	}
	at := slices.IndexFunc(body.Instances, func(x spec.Instance) bool { return x.ID == *id })
	switch verb {
	case "add":
		sha, url, ok := strings.Cut(image+restore, "=")
		if !ok {
			return cli.Usagef(env, "%s: --image and --restore-from are SHA256=https://URL\nusage: %s", name, instanceUsage)
		}
		in.ID, in.GPUs, in.State = *id, gpus, *state
		if in.State == "" {
			in.State = spec.Running
		}
		if restore != "" {
			in.RestoreFrom = &spec.Restore{SHA256: sha, URL: url, Memory: restoreMemory, SPKIPin: pin}
		} else {
			in.Image = sha
			im := spec.Image{SHA256: sha, URL: url, Format: format, SPKIPin: pin}
			if i := slices.IndexFunc(body.Images, func(x spec.Image) bool { return x.SHA256 == sha }); i >= 0 {
				body.Images[i] = im
			} else {
				body.Images = append(body.Images, im)
			}
		}
		if at >= 0 {
			body.Instances[at] = in
		} else {
			body.Instances = append(body.Instances, in)
		}
	case "state":
		if at < 0 {
			return cli.Fail(env, name, fmt.Errorf("%s has no instance %s", pos[0], *id))
		}
		body.Instances[at].State = *state
	case "remove":
		if at < 0 {
			return cli.Fail(env, name, fmt.Errorf("%s has no instance %s", pos[0], *id))
		}
		body.Instances = slices.Delete(body.Instances, at, at+1)
	}
	// Images no instance names go.
	body.Images = slices.DeleteFunc(body.Images, func(im spec.Image) bool {
		return !slices.ContainsFunc(body.Instances, func(x spec.Instance) bool { return x.Image == im.SHA256 })
	})
	section, err := json.Marshal(body)
	if err != nil {
		return cli.Fail(env, name, err)
	}
	if _, err := spec.Decode(section); err != nil {
		return cli.Fail(env, name, err)
	}
	patch := []byte(`{"instances":null}`)
	if len(body.Instances) > 0 {
		patch, _ = json.Marshal(map[string]json.RawMessage{"instances": section})
	}
	gen, err := c.PatchSpec(ctx, pos[0], patch)
	if err != nil {
		return cli.Fail(env, name, err)
	}
	fmt.Fprintf(env.Stdout, "%d\n", gen)
	return 0
}
