// Package nvsmi reads NVIDIA GPUs through the nvidia-smi command instead of
// NVML, so the daemon needs no cgo and never loads libnvidia-ml itself.
//
// A Runner runs nvidia-smi; ExecRunner runs the real binary, tests pass a
// function that replays captured output. The parsers (ParseXML, ParseList,
// ParseComputeCap, ParseTopo, ParseNVLink, ParseMIGProfiles) each read one
// command's output from an io.Reader and never panic on malformed input.
// Collect combines them into one record per GPU, with the values that change
// from one call to the next (temperature, power draw, clocks, utilization,
// memory used, processes) kept apart in GPU.Sample. Check turns a record and
// this boot's XIDs into the diag.nvml findings.
package nvsmi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Timeout bounds each nvidia-smi run of ExecRunner.
const Timeout = 30 * time.Second

// ErrNotFound is returned by ExecRunner's runs when there is no nvidia-smi.
var ErrNotFound = errors.New("nvidia-smi not found (no NVIDIA driver on this host)")

// Runner runs nvidia-smi with args and returns its standard output.
type Runner func(ctx context.Context, args ...string) ([]byte, error)

// ExecRunner runs the nvidia-smi binary at path (looked up in PATH when it
// has no slash; "" means "nvidia-smi"), each run bounded to Timeout. A
// missing binary fails with ErrNotFound.
func ExecRunner(path string) Runner {
	if path == "" {
		path = "nvidia-smi"
	}
	return func(ctx context.Context, args ...string) ([]byte, error) {
		bin, err := exec.LookPath(path)
		if err != nil {
			if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
				return nil, ErrNotFound
			}
			return nil, fmt.Errorf("look up %s: %w", path, err)
		}
		ctx, cancel := context.WithTimeout(ctx, Timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout = &stdout
		cmd.Stderr = &stderr
		err = cmd.Run()
		out := stdout.Bytes()
		if err == nil {
			return out, nil
		}
		what := strings.TrimSpace(bin + " " + strings.Join(args, " "))
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return out, fmt.Errorf("%s: no answer within %s: %w", what, Timeout, ctx.Err())
		}
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(string(out))
		}
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		if msg != "" {
			return out, fmt.Errorf("%s = %w: %s", what, err, msg)
		}
		return out, fmt.Errorf("%s = %w", what, err)
	}
}

// Collect reads every GPU from `nvidia-smi -q -x` and completes the records
// with `-L` (MIG device UUIDs), `--query-gpu=uuid,compute_cap`, `topo -m`,
// `nvlink -s` and, when a GPU has MIG enabled, `mig -lgip`. It fails only
// when `-q -x` fails; when one of the other commands fails it still returns
// the GPUs, together with an error naming what is missing.
func Collect(ctx context.Context, run Runner) ([]GPU, error) {
	out, err := run(ctx, "-q", "-x")
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi -q -x: %w", err)
	}
	gpus, err := ParseXML(bytes.NewReader(out))
	if err != nil {
		return nil, err
	}
	var errs []error
	step := func(args []string, apply func([]byte) error) {
		out, err := run(ctx, args...)
		if err == nil {
			err = apply(out)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("nvidia-smi %s: %w", strings.Join(args, " "), err))
		}
	}
	step([]string{"-L"}, func(b []byte) error {
		l, err := ParseList(bytes.NewReader(b))
		if err == nil {
			applyList(gpus, l)
		}
		return err
	})
	step([]string{"--query-gpu=uuid,compute_cap", "--format=csv,noheader"}, func(b []byte) error {
		cc, err := ParseComputeCap(bytes.NewReader(b))
		for i := range gpus {
			if c, ok := cc[gpus[i].UUID]; ok {
				gpus[i].ComputeCap = c
			}
		}
		return err
	})
	step([]string{"topo", "-m"}, func(b []byte) error {
		t, err := ParseTopo(bytes.NewReader(b))
		if err == nil {
			ApplyTopology(gpus, t)
		}
		return err
	})
	step([]string{"nvlink", "-s"}, func(b []byte) error {
		s, err := ParseNVLink(bytes.NewReader(b))
		if err == nil {
			applyNVLink(gpus, s)
		}
		return err
	})
	if anyMIG(gpus) {
		step([]string{"mig", "-lgip"}, func(b []byte) error {
			p, err := ParseMIGProfiles(bytes.NewReader(b))
			if err == nil {
				applyMIGProfiles(gpus, p)
			}
			return err
		})
	}
	return gpus, errors.Join(errs...)
}

func byIndexOrUUID(gpus []GPU, index int, uuid string) *GPU {
	for i := range gpus {
		if uuid != "" && gpus[i].UUID == uuid {
			return &gpus[i]
		}
	}
	if uuid == "" {
		for i := range gpus {
			if gpus[i].Index == index {
				return &gpus[i]
			}
		}
	}
	return nil
}

func applyList(gpus []GPU, list []Listed) {
	for _, l := range list {
		g := byIndexOrUUID(gpus, l.Index, l.UUID)
		if g == nil {
			continue
		}
		for _, m := range l.MIG {
			for j := range g.MIG.Devices {
				if g.MIG.Devices[j].Index == m.Device {
					g.MIG.Devices[j].UUID = m.UUID
					g.MIG.Devices[j].Profile = m.Profile
				}
			}
		}
	}
}

func applyNVLink(gpus []GPU, st []NVLinkStatus) {
	for _, s := range st {
		if g := byIndexOrUUID(gpus, s.Index, s.UUID); g != nil {
			g.NVLinks = append([]NVLink(nil), s.Links...)
			// nvidia-smi lists no links of a GPU in MIG mode and says so;
			// where -q -x did not say the mode, this does.
			if g.MIG.Current == "" && strings.Contains(s.Note, "MIG mode") {
				g.MIG.Current = "Enabled"
			}
		}
	}
}

func anyMIG(gpus []GPU) bool {
	for _, g := range gpus {
		if g.MIG.Current == "Enabled" || g.MIG.Pending == "Enabled" {
			return true
		}
	}
	return false
}

func applyMIGProfiles(gpus []GPU, p []MIGProfile) {
	for i := range gpus {
		gpus[i].MIG.Profiles = nil
		for _, m := range p {
			if m.GPU == gpus[i].Index {
				gpus[i].MIG.Profiles = append(gpus[i].MIG.Profiles, m)
			}
		}
	}
}

// ApplyTopology copies each GPU's row of t onto gpus: its links to the other
// GPUs (named by UUID) and NICs (named by RDMA device where the legend gives
// one), and its CPU and NUMA affinity.
func ApplyTopology(gpus []GPU, t Topology) {
	name := func(col string) string {
		if rest, ok := strings.CutPrefix(col, "GPU"); ok {
			if n, err := strconv.Atoi(rest); err == nil {
				for _, g := range gpus {
					if g.Index == n && g.UUID != "" {
						return g.UUID
					}
				}
			}
		}
		if nic, ok := t.NICs[col]; ok && nic != "" {
			return nic
		}
		return col
	}
	for _, row := range t.Rows {
		rest, ok := strings.CutPrefix(row.Device, "GPU")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(rest)
		if err != nil {
			continue
		}
		g := byIndexOrUUID(gpus, n, "")
		if g == nil {
			continue
		}
		g.Topology = nil
		for _, col := range t.Columns {
			link := row.Links[col]
			if col == row.Device || link == "" || link == "X" {
				continue
			}
			g.Topology = append(g.Topology, TopoLink{Peer: name(col), Link: link})
		}
		sortTopo(g.Topology)
		g.CPUAffinity = row.CPUAffinity
		g.NUMAAffinity = value(row.NUMAAffinity)
	}
}

func sortTopo(l []TopoLink) {
	for i := 1; i < len(l); i++ {
		for j := i; j > 0 && l[j].Peer < l[j-1].Peer; j-- {
			l[j], l[j-1] = l[j-1], l[j]
		}
	}
}

// Probe asks nvidia-smi for the driver version and the number of GPUs, for
// bcd doctor. With no nvidia-smi the error is ErrNotFound.
func Probe(ctx context.Context, run Runner) (driver string, count int, err error) {
	out, err := run(ctx, "--query-gpu=driver_version", "--format=csv,noheader")
	if err != nil {
		return "", 0, fmt.Errorf("nvidia-smi --query-gpu=driver_version: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		v := value(line)
		if v == "" {
			continue
		}
		if strings.Contains(v, " ") {
			// "No devices were found" and similar.
			return "", 0, fmt.Errorf("nvidia-smi --query-gpu=driver_version: %s", v)
		}
		if driver == "" {
			driver = v
		}
		count++
	}
	return driver, count, nil
}

// NormalizeBusID writes a PCI address the way sysfs does: a four-digit
// domain, lower case, with the function ("00000000:17:00.0" and
// "0000:17:00.0" both become "0000:17:00.0"). An address without a
// function (as in kernel XID messages) keeps none. Anything that is not a
// PCI address comes back lower-cased.
func NormalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return s
	}
	dev, fn, hasFn := strings.Cut(parts[2], ".")
	d, e1 := strconv.ParseUint(parts[0], 16, 32)
	b, e2 := strconv.ParseUint(parts[1], 16, 8)
	v, e3 := strconv.ParseUint(dev, 16, 8)
	if e1 != nil || e2 != nil || e3 != nil || d > 0xffff {
		return s
	}
	out := fmt.Sprintf("%04x:%02x:%02x", d, b, v)
	if hasFn {
		f, err := strconv.ParseUint(fn, 16, 8)
		if err != nil || f > 7 {
			return s
		}
		out += fmt.Sprintf(".%x", f)
	}
	return out
}
