//go:build !linux

package ramdiskkinds

import "errors"

func kexecFileLoad([]byte, []byte, string) error { return errors.New("kexec needs Linux") }

func kexecRebootNow() error { return errors.New("kexec needs Linux") }
