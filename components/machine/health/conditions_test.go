package health

import (
	"strconv"
	"strings"
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
	// The message is the driver's with the Xid table's meaning and action
	// (TestXIDMessage states those words).
	cond := func(subject, reason, msg string, since int64, count uint32) *bcdv1.Condition {
		code, _ := strconv.Atoi(strings.TrimPrefix(reason, "Xid "))
		return &bcdv1.Condition{Type: "Xid", Subject: subject, Reason: reason, Message: XIDMessage(nvsmi.XID{Code: code, Message: msg}),
			SinceUnixMs: since, Count: count}
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

// TestXIDMessage: an Xid condition says what the driver said, what NVIDIA
// documents the Xid to mean, and the action it recommends.
func TestXIDMessage(t *testing.T) {
	for _, tt := range []struct {
		x    nvsmi.XID
		want string
	}{
		{nvsmi.XID{Code: 79, Message: "GPU has fallen off the bus."},
			"GPU has fallen off the bus. (the GPU has fallen off the bus; action: check the GPU's seating, power and cooling, then reboot; contact support (RMA) if it repeats)"},
		{nvsmi.XID{Code: 48}, "double-bit (uncorrectable) ECC error in GPU memory; action: reset the GPU"},
		{nvsmi.XID{Code: 13, Message: "Graphics Exception"},
			"Graphics Exception (graphics engine exception (usually the application: an out-of-range access or illegal instruction); action: restart the application)"},
		{nvsmi.XID{Code: 4321, Message: "new"}, "new (Xid 4321 is not in bcd's table; see NVIDIA's Xid catalog; action: none)"},
	} {
		if got := XIDMessage(tt.x); got != tt.want {
			t.Errorf("XIDMessage(%+v) = %q, want %q", tt.x, got, tt.want)
		}
	}
}

// TestCheckConditions: a check that failed or warned on a GPU of the
// inventory is a condition with its action; xid.recent is left to the Xid
// conditions, and a GPU without nvidia-smi's record has none.
func TestCheckConditions(t *testing.T) {
	gpus := []inventory.GPU{
		{UUID: "GPU-a", PCIBusID: "0000:18:00.0", SMI: &nvsmi.Info{UUID: "GPU-a", PCIBusID: "0000:18:00.0",
			RowRemap: &nvsmi.RowRemap{Pending: true}, RecoveryAction: "Reboot"}},
		{UUID: "GPU-b", PCIBusID: "0000:5d:00.0", SMI: &nvsmi.Info{UUID: "GPU-b", PCIBusID: "0000:5d:00.0"}},
		{UUID: "GPU-c", PCIBusID: "0000:9a:00.0"},
	}
	got, since := checkConditions(gpus, map[string]int64{"GPU-a/recovery.action": 7}, 100)
	want := []*bcdv1.Condition{
		{Type: ConditionCheckWarning, Subject: "GPU-a", Reason: "row-remap.pending", Message: "a row remap waits for a GPU reset; action: reset the GPU when idle", SinceUnixMs: 100, Count: 1},
		{Type: ConditionCheckFailed, Subject: "GPU-a", Reason: "recovery.action", Message: "the driver's recovery action is Reboot; action: reboot the node", SinceUnixMs: 7, Count: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("condition %d = %v, want %v", i, got[i], want[i])
		}
	}
	if len(since) != 2 || since["GPU-a/recovery.action"] != 7 || since["GPU-a/row-remap.pending"] != 100 {
		t.Errorf("since %v", since)
	}
}

// TestUnhealthy: an Xid NVIDIA counts as a GPU fault or a failed check
// keeps new work off a GPU; an application's Xid and a warning do not.
func TestUnhealthy(t *testing.T) {
	gpus := []inventory.GPU{
		{UUID: "GPU-a", PCIBusID: "0000:18:00.0", SMI: &nvsmi.Info{UUID: "GPU-a", PCIBusID: "0000:18:00.0"}},
		{UUID: "GPU-b", PCIBusID: "0000:5d:00.0", SMI: &nvsmi.Info{UUID: "GPU-b", PCIBusID: "0000:5d:00.0", RowRemap: &nvsmi.RowRemap{Pending: true}}},
		{UUID: "GPU-c", PCIBusID: "0000:9a:00.0", SMI: &nvsmi.Info{UUID: "GPU-c", PCIBusID: "0000:9a:00.0", RowRemap: &nvsmi.RowRemap{Failure: true}}},
		{UUID: "GPU-d", PCIBusID: "0000:db:00.0", SMI: &nvsmi.Info{UUID: "GPU-d", PCIBusID: "0000:db:00.0"}},
	}
	m := New(Config{})
	m.gpus = gpus
	m.xids = []nvsmi.XID{{Code: 13, PCIBusID: "0000:18:00"}, {Code: 79, PCIBusID: "0000:db:00"}}
	m.updateConditions()
	for uuid, want := range map[string]string{"GPU-a": "", "GPU-b": "", "GPU-c": "row-remap.failure: row remapping failed", "GPU-d": "Xid 79: the GPU has fallen off the bus"} {
		bad, why := m.Unhealthy(uuid)
		if bad != (want != "") || !strings.HasPrefix(why, want) {
			t.Errorf("Unhealthy(%s) = %v %q, want %q", uuid, bad, why, want)
		}
	}
}
