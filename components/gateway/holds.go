package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/better-compute/bcd/components/base/nodespec"
)

// HoldRequest is one GPU hold as `bcgw hold` asks for it: the devices
// section's hold (docs/devices.md). The node checks it; bcgw only edits
// the node's spec.
type HoldRequest struct {
	Allocation string      `json:"allocation"`
	GPUs       []string    `json:"gpus"`
	Limits     *HoldLimits `json:"limits,omitempty"`
}

// HoldLimits are a hold's limits.
type HoldLimits struct {
	CPUs        string `json:"cpus,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	HugePages2M int64  `json:"hugepages_2m,omitempty"`
}

type devicesSection struct {
	Holds []HoldRequest `json:"holds"`
}

// editHolds changes the holds of a node's devices section with f, as a
// new spec generation (sent as a patch of the devices section).
func (s *Server) editHolds(node string, f func([]HoldRequest) ([]HoldRequest, error)) (uint64, error) {
	if _, err := s.nodeForSpec(node); err != nil {
		return 0, err
	}
	return s.changeSpec(node, func(cur nodespec.Spec) (nodespec.Spec, []byte, error) {
		var d devicesSection
		if b, ok := cur["devices"]; ok {
			if err := json.Unmarshal(b, &d); err != nil {
				return nil, nil, fmt.Errorf("the devices section of %s is not a holds list: %w", node, err)
			}
		}
		holds, err := f(d.Holds)
		if err != nil {
			return nil, nil, err
		}
		if holds == nil {
			holds = []HoldRequest{}
		}
		p, err := json.Marshal(map[string]devicesSection{"devices": {Holds: holds}})
		if err != nil {
			return nil, nil, err
		}
		next, err := nodespec.Merge(cur.Encode(), p)
		if err != nil {
			return nil, nil, err
		}
		return next, p, nil
	})
}

// Hold adds (or replaces) a GPU hold in a node's devices section.
func (s *Server) Hold(node string, h HoldRequest) (uint64, error) {
	if h.Allocation == "" || len(h.GPUs) == 0 {
		return 0, errors.New("a hold needs an allocation and at least one GPU")
	}
	return s.editHolds(node, func(hs []HoldRequest) ([]HoldRequest, error) {
		hs = slices.DeleteFunc(hs, func(x HoldRequest) bool { return x.Allocation == h.Allocation })
		return append(hs, h), nil
	})
}

// Release removes a node's hold by allocation.
func (s *Server) Release(node, alloc string) (uint64, error) {
	return s.editHolds(node, func(hs []HoldRequest) ([]HoldRequest, error) {
		n := len(hs)
		hs = slices.DeleteFunc(hs, func(x HoldRequest) bool { return x.Allocation == alloc })
		if len(hs) == n {
			return nil, fmt.Errorf("node %s has no hold %s", node, alloc)
		}
		return hs, nil
	})
}

func (s *Server) adminHold(w http.ResponseWriter, r *http.Request) {
	var h HoldRequest
	if err := decodeBody(r, &h); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	gen, err := s.Hold(r.PathValue("id"), h)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, GenerationView{Generation: gen})
}

func (s *Server) adminRelease(w http.ResponseWriter, r *http.Request) {
	gen, err := s.Release(r.PathValue("id"), r.PathValue("alloc"))
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, GenerationView{Generation: gen})
}
