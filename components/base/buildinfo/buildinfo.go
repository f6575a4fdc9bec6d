// Package buildinfo holds what the build stamped into a binary: its version,
// commit and the build tags that shaped it.
package buildinfo

import "strconv"

// Version and Commit are set by the Makefile with -ldflags -X.
// Sequence is the release sequence of the release this build is (the
// manifest's `sequence`, docs/update.md), set by the Makefile and
// build/packages.sh from RELEASE_SEQUENCE; "0" for a build that is no
// release.
var (
	Version  = "0.1.0-dev"
	Commit   = "unknown"
	Sequence = "0"
)

// ReleaseSequence is Sequence as a number: the release floor a node
// installed from this build's package starts at (0 when Sequence is not
// a number).
func ReleaseSequence() uint64 {
	n, err := strconv.ParseUint(Sequence, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Tags lists the build tags this binary was compiled with that change its
// behaviour (fakehw, nonvml).
func Tags() []string {
	var t []string
	if FakeHW {
		t = append(t, "fakehw")
	}
	return t
}
