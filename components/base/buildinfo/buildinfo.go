// Package buildinfo holds what the build stamped into a binary: its version,
// commit and the build tags that shaped it.
package buildinfo

// Version and Commit are set by the Makefile with -ldflags -X.
var (
	Version = "0.1.0-dev"
	Commit  = "unknown"
)

// Tags lists the build tags this binary was compiled with that change its
// behaviour (fakehw, nonvml).
func Tags() []string {
	var t []string
	if FakeHW {
		t = append(t, "fakehw")
	}
	return t
}
