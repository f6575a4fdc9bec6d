package unit

import (
	"context"
	"encoding/json"
	"fmt"
)

// IOMMU is iommu: the IOMMU on the kernel command line (intel_iommu=on or
// amd_iommu=on, and iommu=pt so host devices skip translation), which GPU
// passthrough needs: RebootRequired until the running kernel has it.
type IOMMU struct{}

// IOMMUBody is iommu's settings.
type IOMMUBody struct {
	// Vendor is "intel" or "amd" (the switch the kernel reads), or ""
	// for the kernel's default.
	Vendor string `json:"vendor,omitempty"`
	// Passthrough adds iommu=pt.
	Passthrough bool `json:"passthrough,omitempty"`
}

func (IOMMU) Name() string { return "iommu" }

func (i IOMMU) decode(body json.RawMessage) (IOMMUBody, error) {
	var b IOMMUBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	if b.Vendor != "" && b.Vendor != "intel" && b.Vendor != "amd" {
		return b, invalid("vendor %q is not intel or amd", clip(b.Vendor))
	}
	return b, nil
}

func (i IOMMU) Check(body json.RawMessage) error { _, err := i.decode(body); return err }

func (i IOMMU) args(b IOMMUBody) []string {
	var a []string
	if b.Vendor != "" {
		a = append(a, b.Vendor+"_iommu=on")
	}
	if b.Passthrough {
		a = append(a, "iommu=pt")
	}
	return a
}

func (i IOMMU) Plan(_ context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := i.decode(body)
	if err != nil {
		return Plan{}, err
	}
	var p Plan
	d, err := planCmdline(sys, i.Name(), i.args(b), &p)
	if err != nil {
		return Plan{}, err
	}
	p.Detail = d
	return p, nil
}

func (i IOMMU) Apply(ctx context.Context, sys System, _ json.RawMessage, p Plan) error {
	d, ok := p.Detail.(cmdlinePlan)
	if !ok {
		return fmt.Errorf("iommu: no plan")
	}
	return applyCmdline(ctx, sys, d)
}
