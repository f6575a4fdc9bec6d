package admin

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// What a node sends (hostname, conditions, events, command output) is
// untrusted: the page shows it as text, never as markup.
func TestFleetPageEscapesWhatNodesSend(t *testing.T) {
	const evil = `<script>alert(1)</script><img src=x onerror=alert(2)>"'&`
	inv, _ := json.Marshal(map[string]any{"gpus": []map[string]any{{"uuid": evil, "pci_bus_id": evil, "model": evil}}})
	conds := []adminapi.ConditionView{{Type: evil, Subject: evil, Reason: evil, Message: evil}}
	p := fleetPage{Gateway: evil, At: time.Unix(0, 0), Refresh: 5, Errors: []string{evil},
		Nodes: []pageNode{{NodeView: adminapi.NodeView{ID: evil, Hostname: evil, Role: evil, Site: evil, Version: evil, Gateway: evil},
			SpecError: evil, Conditions: conds, Sections: []adminapi.SectionView{{Name: evil, State: evil, Message: evil}},
			GPUs: pageGPUs(inv, conds, map[string]string{"0": evil})}},
		Commands: []pageCommand{{CommandView: adminapi.CommandView{ID: evil, Node: evil, Kind: evil, State: evil, Status: evil}, Result: evil}},
		Events:   []pageEvent{{Node: evil, EventView: adminapi.EventView{Type: evil}, Text: evil}},
	}
	var b bytes.Buffer
	if err := fleetTemplate.Execute(&b, p); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, bad := range []string{"<script", "<img"} {
		if strings.Contains(out, bad) {
			t.Errorf("the page carries %q unescaped", bad)
		}
	}
	if n := strings.Count(out, "&lt;script&gt;alert(1)&lt;/script&gt;"); n < 20 {
		t.Errorf("the node's strings show as text %d times, want every place (20 or more)", n)
	}
	if p.Nodes[0].GPUs[0].Healthy || p.Nodes[0].GPUs[0].HeldBy != evil {
		t.Errorf("GPU: %+v", p.Nodes[0].GPUs[0])
	}
}

func TestPageGPUs(t *testing.T) {
	inv := json.RawMessage(`{"gpus":[{"uuid":"GPU-b","pci_bus_id":"0000:02:00.0","minor":1},{"uuid":"GPU-a","pci_bus_id":"0000:01:00.0","minor":0},{"uuid":"GPU-c","pci_bus_id":"0000:03:00.0","minor":2}]}`)
	conds := []adminapi.ConditionView{{Type: "Xid", Subject: "GPU-b", Reason: "Xid 79"}, {Type: "GPUCheckFailed", Subject: "0000:03:00.0", Reason: "ecc"}}
	holds := specHolds([]byte(`{"devices":{"holds":[{"allocation":"x","gpus":["0"]},{"allocation":"y","gpus":["GPU-c/slot1"]}]}}`))
	got := pageGPUs(inv, conds, holds)
	want := []struct {
		idx, uuid, health, held string
	}{{"0", "GPU-a", "ok", "x"}, {"1", "GPU-b", "Xid Xid 79", ""}, {"2", "GPU-c", "GPUCheckFailed ecc", "y"}}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i, w := range want {
		g := got[i]
		if g.Index != w.idx || g.UUID != w.uuid || g.Health != w.health || g.HeldBy != w.held || g.Healthy != (w.health == "ok") {
			t.Errorf("GPU %d: %+v, want %+v", i, g, w)
		}
	}
	if pageGPUs(json.RawMessage(`{"gpus":"nope"}`), nil, nil) != nil || pageGPUs(nil, nil, nil) != nil {
		t.Error("a bad or absent inventory lists GPUs")
	}
}
