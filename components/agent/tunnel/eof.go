package tunnel

import "io"

var errEOF = io.EOF
