package tunnel

import (
	"errors"
	"io"
	"syscall"
)

var errEOF = io.EOF

// isEIO is a terminal's read once its other side closed.
func isEIO(err error) bool { return errors.Is(err, syscall.EIO) }
