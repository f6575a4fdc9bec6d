package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Hugepages is hugepages: the 2 MiB pool set at run time
// (/sys/kernel/mm/hugepages) and kept in /etc/sysctl.d/90-bcd-hugepages.conf
// for the next boot; the 1 GiB pool on the kernel command line
// (hugepagesz=1G hugepages=N), where only boot time finds the contiguous
// memory: RebootRequired until the running kernel has it.
type Hugepages struct{}

// HugepagesBody is hugepages' settings.
type HugepagesBody struct {
	Pages2M *uint32 `json:"pages_2m,omitempty"`
	Pages1G uint32  `json:"pages_1g,omitempty"`
}

// Files and kernel files hugepages uses.
const (
	HugepagesFile = "/etc/sysctl.d/90-bcd-hugepages.conf"
	Pool2M        = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
)

func (Hugepages) Name() string { return "hugepages" }

func (h Hugepages) decode(body json.RawMessage) (HugepagesBody, error) {
	var b HugepagesBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	if b.Pages2M != nil && *b.Pages2M > 1<<22 {
		return b, invalid("pages_2m %d is more than %d (8 TiB)", *b.Pages2M, 1<<22)
	}
	if b.Pages1G > 1<<13 {
		return b, invalid("pages_1g %d is more than %d (8 TiB)", b.Pages1G, 1<<13)
	}
	return b, nil
}

func (h Hugepages) Check(body json.RawMessage) error { _, err := h.decode(body); return err }

func (h Hugepages) args(b HugepagesBody) []string {
	if b.Pages1G == 0 {
		return nil
	}
	return []string{"hugepagesz=1G", "hugepages=" + strconv.FormatUint(uint64(b.Pages1G), 10)}
}

type hugepagesPlan struct {
	file    string
	set2M   bool
	cmdline cmdlinePlan
}

func (h Hugepages) Plan(_ context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := h.decode(body)
	if err != nil {
		return Plan{}, err
	}
	var p Plan
	var d hugepagesPlan
	if b.Pages2M != nil {
		d.file = header(h.Name()) + "vm.nr_hugepages = " + strconv.FormatUint(uint64(*b.Pages2M), 10) + "\n"
	}
	c, err := syncFile(sys, HugepagesFile, d.file)
	if err != nil {
		return Plan{}, err
	}
	if c != "" {
		p.Changes = append(p.Changes, c)
	}
	if b.Pages2M != nil {
		have, err := sys.ReadFile(Pool2M)
		if err != nil {
			return Plan{}, fmt.Errorf("the 2 MiB pool: %w (a kernel without huge pages)", err)
		}
		if n := strings.TrimSpace(string(have)); n != strconv.FormatUint(uint64(*b.Pages2M), 10) {
			p.Changes = append(p.Changes, fmt.Sprintf("set the 2 MiB pool to %d pages (now %s)", *b.Pages2M, n))
			d.set2M = true
		}
	}
	if d.cmdline, err = planCmdline(sys, h.Name(), h.args(b), &p); err != nil {
		return Plan{}, err
	}
	p.Detail = d
	return p, nil
}

func (h Hugepages) Apply(ctx context.Context, sys System, body json.RawMessage, p Plan) error {
	d, ok := p.Detail.(hugepagesPlan)
	if !ok {
		return fmt.Errorf("hugepages: no plan")
	}
	b, err := h.decode(body)
	if err != nil {
		return err
	}
	if err := putFile(sys, HugepagesFile, d.file); err != nil {
		return err
	}
	if d.set2M {
		want := strconv.FormatUint(uint64(*b.Pages2M), 10)
		if err := sys.WriteKernel(Pool2M, want); err != nil {
			return err
		}
		// The kernel grants what it can find; fewer pages is a failure
		// the next pass tries again (memory freed, compaction).
		if have, err := sys.ReadFile(Pool2M); err == nil && strings.TrimSpace(string(have)) != want {
			return fmt.Errorf("the kernel made %s of %s 2 MiB pages (not enough free contiguous memory)", strings.TrimSpace(string(have)), want)
		}
	}
	return applyCmdline(ctx, sys, d.cmdline)
}
