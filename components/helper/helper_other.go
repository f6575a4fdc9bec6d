//go:build !linux

package helper

import (
	"context"
	"errors"
	"log/slog"
)

type seams struct{}

func hostSeams() seams { return seams{} }

func serve(context.Context, Config, *slog.Logger, seams) error {
	return errors.New("bcd helper runs on Linux only (it needs SO_PEERCRED)")
}

// RollbackNow is bcd-helper update-rollback, on Linux only.
func RollbackNow(context.Context, Config, bool) (string, error) {
	return "", errors.New("bcd helper runs on Linux only")
}
