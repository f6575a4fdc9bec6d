package config

import (
	"encoding/base64"
	"errors"
	"strings"
)

// pinPrefix starts every pin: the hash the base64 part is of.
const pinPrefix = "sha256/"

// checkPin requires sha256/ followed by the standard, padded base64 encoding
// of 32 bytes. The value is not echoed in the error.
func checkPin(s string) error {
	b64, ok := strings.CutPrefix(s, pinPrefix)
	if !ok {
		return errors.New("must start with sha256/ and be followed by the base64 SHA-256 of the key, e.g. sha256/" + strings.Repeat("A", 43) + "=")
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return errors.New("the part after sha256/ is not standard padded base64 (44 characters ending in =)")
	}
	if len(raw) != 32 {
		return errors.New("the part after sha256/ must encode 32 bytes (a SHA-256 digest)")
	}
	return nil
}
