package adminapi

import (
	"encoding/json"
	"testing"
	"time"
)

func TestDiscovered(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	report := `{"images":[],"discovered":[
		{"mac":"52:54:00:77:00:99","arch":"bios","first_seen":"2026-12-01T11:00:00Z","last_seen":"2026-12-01T11:30:00Z","count":3},
		{"mac":"52:54:00:77:00:98","first_seen":"2026-12-01T11:00:00Z","last_seen":"2026-12-01T11:00:00Z","count":1},
		{"mac":"not a mac","first_seen":"2026-12-01T11:00:00Z","last_seen":"2026-12-01T11:00:00Z","count":1},
		{"mac":"52:54:00:77:00:97","arch":"<script>","first_seen":"2026-12-01T11:00:00Z","last_seen":"2026-12-01T11:00:00Z","count":1},
		{"mac":"52:54:00:77:00:96","first_seen":"2026-12-01T11:00:00Z","last_seen":"2026-12-01T10:00:00Z","count":1},
		{"mac":"52:54:00:77:00:95","first_seen":"2026-12-01T11:00:00Z","last_seen":"2027-12-01T11:00:00Z","count":1},
		{"mac":"52:54:00:77:00:94","first_seen":"2026-12-01T11:00:00Z","last_seen":"2026-12-01T11:00:00Z","count":0},
		{"mac":"52:54:00:77:00:93","first_seen":"2026-12-01T11:00:00Z","last_seen":"2026-12-01T11:00:00Z","count":1,"x":1},
		{"mac":"00:00:00:00:00:00:00:01","first_seen":"2026-12-01T11:00:00Z","last_seen":"2026-12-01T11:00:00Z","count":1},
		"a string"]}`
	got, dropped := Discovered(json.RawMessage(report), at)
	if len(got) != 3 || got[0].MAC != "52:54:00:77:00:99" || got[0].Count != 3 || got[2].MAC != "52:54:00:77:00:93" || dropped != 7 {
		t.Errorf("Discovered = %+v, dropped %d", got, dropped)
	}
	if got, dropped := Discovered(json.RawMessage(`{"discovered":"x"}`), at); got != nil || dropped != 0 {
		t.Errorf("a section that is not a list: %v %d", got, dropped)
	}
}

func FuzzDiscovered(f *testing.F) {
	f.Add([]byte(`{"discovered":[{"mac":"52:54:00:77:00:99","first_seen":"2026-12-01T11:00:00Z","last_seen":"2026-12-01T11:30:00Z","count":3}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, _ := Discovered(json.RawMessage(b), time.Time{})
		for _, d := range got {
			if d.Count < 1 || !knownArch[d.Arch] || len(d.MAC) != 17 {
				t.Fatalf("kept %+v", d)
			}
		}
	})
}
