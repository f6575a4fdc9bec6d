package admin

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
)

// What the fleet page shows at most.
const (
	pageCommands      = 25 // the newest commands across nodes
	pageEventsPerNode = 10 // each node's newest events
	pageEvents        = 50 // the newest events across nodes
	pageTextMax       = 300
)

// fleetPage is what the fleet page renders: every value is text the
// template escapes, whatever a node sent.
type fleetPage struct {
	Gateway  string
	At       time.Time
	Refresh  int
	Nodes    []pageNode
	GPUs     int
	Held     int
	Commands []pageCommand
	Events   []pageEvent
	Errors   []string // what could not be read (the page shows the rest)
}

type pageNode struct {
	adminapi.NodeView
	SpecGeneration, AppliedGeneration, ObservedGeneration uint64
	SpecError                                             string
	Sections                                              []adminapi.SectionView
	Conditions                                            []adminapi.ConditionView
	GPUs                                                  []pageGPU
}

type pageGPU struct {
	Index    string
	UUID     string
	PCIBusID string
	Model    string
	Health   string // "ok", or the conditions naming the GPU
	Healthy  bool
	HeldBy   string
}

type pageCommand struct {
	adminapi.CommandView
	Result string // the output or error, shortened
}

type pageEvent struct {
	Node string
	adminapi.EventView
	Text string // the body, shortened
}

// inventoryGPU is what the page reads of a GPU in a node's inventory
// (the machine domain's inventory.GPU; the gateway does not import it).
type inventoryGPU struct {
	UUID     string `json:"uuid"`
	PCIBusID string `json:"pci_bus_id"`
	Model    string `json:"model"`
	Minor    *int   `json:"minor"`
}

// short cuts s to pageTextMax characters.
func short(s string) string {
	if r := []rune(s); len(r) > pageTextMax {
		return string(r[:pageTextMax]) + "…"
	}
	return s
}

// buildPage reads the fleet for the page.
func (s *API) buildPage() fleetPage {
	p := fleetPage{Gateway: s.Name(), At: s.Now().UTC(), Refresh: 5}
	nodes, err := s.nodeViews()
	if err != nil {
		p.Errors = append(p.Errors, "nodes: "+err.Error())
	}
	for _, n := range nodes {
		pn := pageNode{NodeView: n}
		st, err := s.Status(n.ID)
		if err != nil {
			p.Errors = append(p.Errors, n.ID+": "+err.Error())
		}
		pn.SpecGeneration, pn.AppliedGeneration, pn.ObservedGeneration = st.SpecGeneration, st.AppliedGeneration, st.ObservedGeneration
		pn.SpecError, pn.Sections, pn.Conditions = st.SpecError, st.Sections, st.Conditions
		_, spec, _ := s.Spec(n.ID)
		pn.GPUs = pageGPUs(st.Inventory, st.Conditions, specHolds(spec))
		p.GPUs += len(pn.GPUs)
		for _, g := range pn.GPUs {
			if g.HeldBy != "" {
				p.Held++
			}
		}
		p.Nodes = append(p.Nodes, pn)
		evs, err := s.Events(n.ID, 0)
		if err != nil {
			p.Errors = append(p.Errors, n.ID+" events: "+err.Error())
		}
		for _, e := range evs[max(0, len(evs)-pageEventsPerNode):] {
			p.Events = append(p.Events, pageEvent{Node: n.ID, EventView: e, Text: short(string(e.Body))})
		}
	}
	slices.SortStableFunc(p.Events, func(a, b pageEvent) int { return b.At.Compare(a.At) })
	p.Events = p.Events[:min(len(p.Events), pageEvents)]
	cmds, err := s.store.RecentCommands(pageCommands)
	if err != nil {
		p.Errors = append(p.Errors, "commands: "+err.Error())
	}
	for _, c := range cmds {
		v := fleet.ViewCommand(c)
		pc := pageCommand{CommandView: v, Result: short(cmp.Or(v.Error, string(v.Output)))}
		p.Commands = append(p.Commands, pc)
	}
	return p
}

// specHolds maps each GPU a desired spec's devices section holds (as the
// hold names it: an index, a UUID, or a MIG or slot of one) to its
// allocation.
func specHolds(spec []byte) map[string]string {
	var sp struct {
		Devices struct {
			Holds []adminapi.HoldRequest `json:"holds"`
		} `json:"devices"`
	}
	out := map[string]string{}
	if json.Unmarshal(spec, &sp) != nil {
		return out
	}
	for _, h := range sp.Devices.Holds {
		for _, g := range h.GPUs {
			// N/giG/ciC and N/slotS hold part of GPU N.
			g, _, _ = strings.Cut(g, "/")
			if _, taken := out[g]; !taken {
				out[g] = h.Allocation
			}
		}
	}
	return out
}

// pageGPUs lists a node's GPUs from its inventory, with the conditions
// naming each (by UUID or PCI bus id) and the allocation holding it.
func pageGPUs(inv json.RawMessage, conds []adminapi.ConditionView, holds map[string]string) []pageGPU {
	var sections struct {
		GPUs []inventoryGPU `json:"gpus"`
	}
	if len(inv) == 0 || json.Unmarshal(inv, &sections) != nil {
		return nil
	}
	var out []pageGPU
	for i, g := range sections.GPUs {
		idx := strconv.Itoa(i)
		if g.Minor != nil {
			idx = strconv.Itoa(*g.Minor)
		}
		pg := pageGPU{Index: idx, UUID: g.UUID, PCIBusID: g.PCIBusID, Model: g.Model, Healthy: true, Health: "ok"}
		var bad []string
		for _, c := range conds {
			if c.Subject != "" && (c.Subject == g.UUID || c.Subject == g.PCIBusID) {
				bad = append(bad, strings.TrimSpace(c.Type+" "+c.Reason))
			}
		}
		if len(bad) > 0 {
			pg.Healthy, pg.Health = false, short(strings.Join(bad, "; "))
		}
		pg.HeldBy = cmp.Or(holds[idx], holds[g.UUID])
		out = append(out, pg)
	}
	slices.SortStableFunc(out, func(a, b pageGPU) int {
		x, errA := strconv.Atoi(a.Index)
		y, errB := strconv.Atoi(b.Index)
		if errA != nil || errB != nil {
			return strings.Compare(a.Index, b.Index)
		}
		return cmp.Compare(x, y)
	})
	return out
}
