//go:build !linux

package ramdiskkinds

import "errors"

func mountPartition(string, int, bool) (string, func() error, error) {
	return "", nil, errors.New("mounting an installed OS needs Linux")
}
