package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestManPageNamesEveryCommand: bcgw(1), which the bcgw package ships,
// lists every command of the table in main.go (as ".BR name ," with
// roff's escaped hyphens), and nothing that is not one.
func TestManPageNamesEveryCommand(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "build", "man", "bcgw.1"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == ".BR" && (f[2] == "," || f[2] == ".") {
			listed[strings.ReplaceAll(f[1], `\-`, "-")] = true
		}
	}
	for _, c := range program().Commands {
		if !listed[c.Name] {
			t.Errorf("build/man/bcgw.1 does not list the command %s", c.Name)
		}
		delete(listed, c.Name)
	}
	delete(listed, "version") // the command frame's own (components/base/cli)
	for name := range listed {
		t.Errorf("build/man/bcgw.1 lists %s, which is no bcgw command", name)
	}
}
