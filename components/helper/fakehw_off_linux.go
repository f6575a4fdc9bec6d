//go:build !fakehw

package helper

// fakeGPUs is empty outside a fakehw build.
func fakeGPUs() []string { return nil }

// topology is this host's, from sysfs.
func topology() (cpus, mems string, err error) { return hostTopology("/sys") }
