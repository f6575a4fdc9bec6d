package agentcmd

import (
	"reflect"
	"strings"
	"testing"
)

func TestPerProcess(t *testing.T) {
	for _, c := range []struct {
		limit uint64
		want  int
	}{
		{20000, (20000 - filesReserved) / FilesPerMachine},
		{1024, (1024 - filesReserved) / FilesPerMachine},
		{filesReserved + FilesPerMachine, 1},
		{10, 1},
		{0, 1},
	} {
		if got := PerProcess(c.limit); got != c.want {
			t.Errorf("PerProcess(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
	// 10,000 machines need more than one process under this sandbox's
	// limit of 20,000 open files.
	if PerProcess(20000) >= 10000 {
		t.Errorf("PerProcess(20000) = %d: one process would hold %d files", PerProcess(20000), 10000*FilesPerMachine)
	}
}

func TestShards(t *testing.T) {
	for _, c := range []struct {
		nodes, per int
		want       [][2]int
	}{
		{10, 10, [][2]int{{0, 10}}},
		{10, 4, [][2]int{{0, 4}, {4, 4}, {8, 2}}},
		{10000, 4984, [][2]int{{0, 4984}, {4984, 4984}, {9968, 32}}},
		{1, 1, [][2]int{{0, 1}}},
	} {
		if got := shards(c.nodes, c.per); !reflect.DeepEqual(got, c.want) {
			t.Errorf("shards(%d, %d) = %v, want %v", c.nodes, c.per, got, c.want)
		}
	}
}

func TestParseShard(t *testing.T) {
	if f, n, err := parseShard("4:3", 7); err != nil || f != 4 || n != 3 {
		t.Fatalf("parseShard(4:3, 7) = %d %d %v", f, n, err)
	}
	for _, bad := range []string{"", "4", "4:", ":3", "-1:3", "4:0", "4:4", "x:1", "1:x"} {
		if _, _, err := parseShard(bad, 7); err == nil || !strings.Contains(err.Error(), "FIRST:COUNT") {
			t.Errorf("parseShard(%q, 7) = %v, want an error naming FIRST:COUNT", bad, err)
		}
	}
}

func TestReadReboots(t *testing.T) {
	out := "bcd sim: 7 machines, 0 joined this run, 3 reboots\n"
	if n := readReboots(strings.NewReader(out)); n != 3 {
		t.Fatalf("readReboots = %d, want 3", n)
	}
}
