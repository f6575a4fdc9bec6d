//go:build !helpere2e

package helper

// e2eSeams changes nothing in a release build.
func e2eSeams(*seams) {}
