package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

type devicesSection struct {
	Holds []adminapi.HoldRequest `json:"holds"`
}

// editHolds changes the holds of a node's devices section with f, as a
// new spec generation (sent as a patch of the devices section).
func (s *Fleet) editHolds(node string, f func([]adminapi.HoldRequest) ([]adminapi.HoldRequest, error)) (uint64, error) {
	if _, err := s.NodeForSpec(node); err != nil {
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
			holds = []adminapi.HoldRequest{}
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
func (s *Fleet) Hold(node string, h adminapi.HoldRequest) (uint64, error) {
	if h.Allocation == "" || len(h.GPUs) == 0 {
		return 0, errors.New("a hold needs an allocation and at least one GPU")
	}
	return s.editHolds(node, func(hs []adminapi.HoldRequest) ([]adminapi.HoldRequest, error) {
		hs = slices.DeleteFunc(hs, func(x adminapi.HoldRequest) bool { return x.Allocation == h.Allocation })
		return append(hs, h), nil
	})
}

// Release removes a node's hold by allocation.
func (s *Fleet) Release(node, alloc string) (uint64, error) {
	return s.editHolds(node, func(hs []adminapi.HoldRequest) ([]adminapi.HoldRequest, error) {
		n := len(hs)
		hs = slices.DeleteFunc(hs, func(x adminapi.HoldRequest) bool { return x.Allocation == alloc })
		if len(hs) == n {
			return nil, fmt.Errorf("node %s has no hold %s", node, alloc)
		}
		return hs, nil
	})
}
