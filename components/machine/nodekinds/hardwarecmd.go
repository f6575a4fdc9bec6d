package nodekinds

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// HardwareCommand is `bcd hardware [--json]`: what this machine is, as the
// inventory reports it (DMI serials need root).
func HardwareCommand(hardware func(dataDir string) (Hardware, string)) cli.Command {
	return cli.Command{Name: "hardware", Summary: "print this machine's inventory", Run: func(ctx context.Context, env *cli.Env, args []string) int {
		fs := cli.NewFlagSet(env, "bcd", "hardware")
		asJSON := fs.Bool("json", false, "print the whole inventory as JSON")
		path := fs.String("config", config.DefaultPath, "the configuration file (for data_dir; optional)")
		if code, ok := cli.Parse(fs, env, args, ""); !ok {
			return code
		}
		dataDir := config.DefaultDataDir
		if cfg, err := config.Load(*path); err == nil {
			dataDir = cfg.DataDir
		}
		hw, backend := hardware(dataDir)
		inv, err := hw.Inventory(ctx)
		if err != nil {
			return cli.Fail(env, "bcd hardware", err)
		}
		// The GPUs' verdicts, from the same checks as diag.nvml, ride in
		// the unhashed live part of the inventory.
		findings, xerr := Judge(ctx, hw, inv.SMIGPUs())
		inv.SetFindings(findings)
		if xerr != nil {
			inv.Notes = append(inv.Notes, fmt.Sprintf("reading this boot's Xids: %v", xerr))
		}
		if *asJSON {
			enc := json.NewEncoder(env.Stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(inv); err != nil {
				return cli.Fail(env, "bcd hardware", err)
			}
			return 0
		}
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "backend\t%s\n", backend)
		fmt.Fprintf(tw, "system\t%s %s (serial %s, uuid %s)\n", inv.System.Vendor, inv.System.Product, orDash(inv.System.Serial), orDash(inv.System.ProductUUID))
		fmt.Fprintf(tw, "cpu\t%s, %d sockets, %d cores, %d threads, %d NUMA nodes\n", inv.CPU.Model, inv.CPU.Sockets, inv.CPU.Cores, inv.CPU.Threads, len(inv.CPU.NUMA))
		fmt.Fprintf(tw, "memory\t%d MiB\n", inv.Memory.TotalBytes>>20)
		fmt.Fprintf(tw, "disks\t%d\n", len(inv.Disks))
		fmt.Fprintf(tw, "nics\t%d\n", len(inv.NICs))
		fmt.Fprintf(tw, "gpus\t%d\n", len(inv.GPUs))
		for _, g := range inv.GPUs {
			line := fmt.Sprintf("%s %s %s", g.PCIBusID, g.UUID, g.Model)
			if g.SMI != nil {
				verdict, problems := Verdict(Of(findings, nvsmi.GPU{Info: *g.SMI}))
				line += ": " + string(verdict)
				if len(problems) > 0 {
					line += ": " + strings.Join(problems, "; ")
				}
			}
			fmt.Fprintf(tw, "  gpu\t%s\n", line)
		}
		fmt.Fprintf(tw, "os\t%s, kernel %s\n", inv.OS.PrettyName, inv.OS.Kernel)
		fmt.Fprintf(tw, "kvm\t%v\n", inv.KVM.Present)
		fmt.Fprintf(tw, "iommu\t%d units, %d groups\n", inv.IOMMU.Units, inv.IOMMU.Groups)
		fmt.Fprintf(tw, "hash\t%s\n", inv.Hash)
		names := make([]string, 0, len(inv.SectionHashes))
		for n := range inv.SectionHashes {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(tw, "  %s\t%s\n", n, inv.SectionHashes[n])
		}
		for _, n := range inv.Notes {
			fmt.Fprintf(tw, "note\t%s\n", n)
		}
		tw.Flush()
		return 0
	}}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
