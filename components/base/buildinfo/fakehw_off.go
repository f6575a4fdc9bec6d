//go:build !fakehw

package buildinfo

// FakeHW reports whether this is a fake-hardware build (-tags fakehw).
const FakeHW = false
