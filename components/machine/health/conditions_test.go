package health

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nvsmi"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

func TestBuildConditions(t *testing.T) {
	gpus := []inventory.GPU{
		{UUID: "GPU-b", PCIBusID: "0000:18:00.0"},
		{UUID: "GPU-a", PCIBusID: "0000:5d:00.0"},
		{UUID: "", PCIBusID: "0000:9a:00.0"}, // /proc did not show its UUID
	}
	const now = 5000
	cond := func(subject, reason, msg string, since int64, count uint32) *bcdv1.Condition {
		return &bcdv1.Condition{Type: "Xid", Subject: subject, Reason: reason, Message: msg, SinceUnixMs: since, Count: count}
	}
	tests := []struct {
		name      string
		xids      []nvsmi.XID
		gpus      []inventory.GPU
		since     map[string]int64
		want      []*bcdv1.Condition
		wantSince map[string]int64
	}{
		{name: "no Xids", gpus: gpus, want: nil, wantSince: map[string]int64{}},
		{
			name:      "a kernel line names a known GPU by bus id",
			xids:      []nvsmi.XID{{Code: 79, PCIBusID: "0000:5d:00", Message: "GPU has fallen off the bus."}},
			gpus:      gpus,
			want:      []*bcdv1.Condition{cond("GPU-a", "Xid 79", "GPU has fallen off the bus.", now, 1)},
			wantSince: map[string]int64{"GPU-a": now},
		},
		{
			name: "the latest Xid gives reason and message, all count",
			xids: []nvsmi.XID{
				{Code: 48, PCIBusID: "0000:18:00", Message: "DBE"},
				{Code: 63, PCIBusID: "0000:5d:00", Message: "remap"},
				{Code: 79, PCIBusID: "0000:18:00", Message: "fallen"},
			},
			gpus:      gpus,
			since:     map[string]int64{"GPU-b": 1000, "GPU-gone": 1},
			want:      []*bcdv1.Condition{cond("GPU-a", "Xid 63", "remap", now, 1), cond("GPU-b", "Xid 79", "fallen", 1000, 2)},
			wantSince: map[string]int64{"GPU-a": now, "GPU-b": 1000},
		},
		{
			name: "addresses written every way match",
			xids: []nvsmi.XID{
				{Code: 13, PCIBusID: "00000000:18:00.0"},
				{Code: 13, PCIBusID: "PCI:0000:18:00"},
				{Code: 13, PCIBusID: "0000:18:00.0"},
			},
			gpus:      gpus,
			want:      []*bcdv1.Condition{cond("GPU-b", "Xid 13", "", now, 3)},
			wantSince: map[string]int64{"GPU-b": now},
		},
		{
			name:      "a GPU the inventory does not know is named by its bus id",
			xids:      []nvsmi.XID{{Code: 79, PCIBusID: "0000:DB:00", Message: "x"}, {Code: 31, PCIBusID: "0000:9a:00"}},
			gpus:      gpus,
			want:      []*bcdv1.Condition{cond("0000:9a:00", "Xid 31", "", now, 1), cond("0000:db:00", "Xid 79", "x", now, 1)},
			wantSince: map[string]int64{"0000:9a:00": now, "0000:db:00": now},
		},
		{
			name:      "before any inventory",
			xids:      []nvsmi.XID{{Code: 79, PCIBusID: "0000:5d:00"}},
			since:     map[string]int64{"0000:5d:00": 42},
			want:      []*bcdv1.Condition{cond("0000:5d:00", "Xid 79", "", 42, 1)},
			wantSince: map[string]int64{"0000:5d:00": 42},
		},
		{
			name:      "an inventory names the GPU first seen by bus id: since is kept",
			xids:      []nvsmi.XID{{Code: 79, PCIBusID: "0000:5d:00"}},
			gpus:      gpus,
			since:     map[string]int64{"0000:5d:00": 42},
			want:      []*bcdv1.Condition{cond("GPU-a", "Xid 79", "", 42, 1)},
			wantSince: map[string]int64{"GPU-a": 42},
		},
		{
			name: "an injected Xid by UUID joins the kernel's by bus id",
			xids: []nvsmi.XID{
				{Code: 79, PCIBusID: "0000:5d:00", Message: "kernel"},
				{Code: 13, UUID: "GPU-a", Message: "injected"},
				{Code: 74, UUID: "GPU-elsewhere"},
			},
			gpus:      gpus,
			want:      []*bcdv1.Condition{cond("GPU-a", "Xid 13", "injected", now, 2), cond("GPU-elsewhere", "Xid 74", "", now, 1)},
			wantSince: map[string]int64{"GPU-a": now, "GPU-elsewhere": now},
		},
		{
			name:      "an Xid naming no GPU",
			xids:      []nvsmi.XID{{Code: 79}},
			gpus:      gpus,
			want:      []*bcdv1.Condition{cond("unknown", "Xid 79", "", now, 1)},
			wantSince: map[string]int64{"unknown": now},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, since := buildConditions(tt.xids, tt.gpus, tt.since, now)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if !proto.Equal(got[i], tt.want[i]) {
					t.Errorf("condition %d = %v, want %v", i, got[i], tt.want[i])
				}
			}
			if len(since) != len(tt.wantSince) {
				t.Errorf("since %v, want %v", since, tt.wantSince)
			}
			for k, v := range tt.wantSince {
				if since[k] != v {
					t.Errorf("since %v, want %v", since, tt.wantSince)
				}
			}
		})
	}
}
