package kmod

import "golang.org/x/sys/unix"

func finitModule(fd int, params string, flags int) error { return unix.FinitModule(fd, params, flags) }

func initModule(image []byte, params string) error { return unix.InitModule(image, params) }
