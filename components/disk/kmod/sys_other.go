//go:build !linux

package kmod

import "syscall"

func finitModule(int, string, int) error { return syscall.ENOSYS }

func initModule([]byte, string) error { return syscall.ENOSYS }
