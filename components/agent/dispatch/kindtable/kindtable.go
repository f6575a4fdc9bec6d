// Package kindtable pins a role's whole kind table, for the role's tests:
// the kinds a role accepts are a checked-in list, roles/<role>/kinds.txt
// (one kind a line, sorted), as its dependencies are in deps.txt. Check
// fails when the role wires a kind its list lacks or lacks one its list
// names, and delivers every kind of every other role's list to a real
// dispatcher holding the role's kinds, which must refuse each as
// UNSUPPORTED. `make kinds-lists` (go test ./roles/... -run
// TestKindTable -update-kinds) rewrites the lists on purpose.
package kindtable

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/journal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

var update = flag.Bool("update-kinds", false, "rewrite roles/<role>/kinds.txt from the kinds the role wires")

// FakePrefix begins the test kinds of a fakehw build, which no list names.
const FakePrefix = "fakehw."

// File is a role's list, from the role's package directory (a test's
// working directory).
const File = "kinds.txt"

// Names are the sorted names of kinds, the fakehw build's test kinds left out.
func Names(kinds []dispatch.Kind) []string {
	var out []string
	for _, k := range kinds {
		if !strings.HasPrefix(k.Name, FakePrefix) {
			out = append(out, k.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Read reads a kinds.txt.
func Read(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// Check compares the kinds role wires with its kinds.txt (or rewrites the
// list under -update-kinds), then checks that a dispatcher with those
// kinds refuses every kind of the other roles' lists that role's list
// lacks as UNSUPPORTED. It runs in the role's package directory.
func Check(t *testing.T, role string, kinds []dispatch.Kind) {
	t.Helper()
	got := Names(kinds)
	if *update {
		if err := os.WriteFile(File, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	own, err := Read(File)
	if err != nil {
		t.Fatalf("roles/%s/%s: %v (make kinds-lists writes it)", role, File, err)
	}
	for _, k := range got {
		if !slices.Contains(own, k) {
			t.Errorf("each role accepts only its own kinds: %s accepts %s, which roles/%s/%s does not list (make kinds-lists rewrites the list on purpose)", role, k, role, File)
		}
	}
	for _, k := range own {
		if !slices.Contains(got, k) {
			t.Errorf("roles/%s/%s lists %s, which %s no longer accepts (make kinds-lists rewrites the list on purpose)", role, File, k, role)
		}
	}

	others, err := filepath.Glob(filepath.Join("..", "*", File))
	if err != nil {
		t.Fatal(err)
	}
	foreign := map[string]string{} // kind -> a role whose list names it
	for _, p := range others {
		r := filepath.Base(filepath.Dir(p))
		if r == role {
			continue
		}
		ks, err := Read(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			if !slices.Contains(own, k) {
				foreign[k] = r
			}
		}
	}
	if len(others) < 2 || len(foreign) == 0 {
		t.Fatalf("found %d roles' lists (%v) and no kind of another role to refuse", len(others), others)
	}
	j, _, err := journal.Open(filepath.Join(t.TempDir(), journal.File), "node-kindtable")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	d, err := dispatch.New(dispatch.Config{NodeID: "node-kindtable", Journal: j, Kinds: kinds})
	if err != nil {
		t.Fatal(err)
	}
	for k, r := range foreign {
		id := "cmd-" + strings.ReplaceAll(k, ".", "-")
		if err := d.Deliver(&bcdv1.Command{Id: id, Kind: k, NodeId: "node-kindtable"}); err != nil {
			t.Fatalf("delivering %s: %v", k, err)
		}
		e, err := j.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		var res bcdv1.CommandResult
		if e == nil || e.State != journal.Done || proto.Unmarshal(e.Result, &res) != nil || res.GetStatus() != dispatch.Unsupported {
			t.Errorf("each role accepts only its own kinds: %s took %s (a %s kind) instead of refusing it as UNSUPPORTED (entry %+v, result %v)", role, k, r, e, &res)
		}
	}
}
