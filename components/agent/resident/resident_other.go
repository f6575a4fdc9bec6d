//go:build !linux

package resident

// Drop does nothing where the process cannot give its pages back.
func Drop() (int64, error) { return 0, nil }
