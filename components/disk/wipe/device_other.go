//go:build !linux

package wipe

import "errors"

// Open is Linux only.
func Open(path string) (Device, error) {
	return nil, errors.New("wipe: block devices are wiped on Linux only")
}
