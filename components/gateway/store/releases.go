package store

import "errors"

// ErrReleaseConflict: a release version is already stored with another
// document (a version is published once; a new build is a new version).
var ErrReleaseConflict = errors.New("release is already published with another document")

// Releases keeps the published self-update releases (docs/update.md) in
// the database, so that every gateway sharing it serves each release's
// binaries and knows its document, whichever gateway published it. A
// bbolt store does not implement it: a lone gateway keeps its releases as
// files in its data directory.
type Releases interface {
	// PutRelease stores a release document and its binaries, keyed by
	// their SHA-256, in one transaction. The same document again stores
	// nothing new; another document for a stored version is
	// ErrReleaseConflict and stores nothing.
	PutRelease(version string, doc []byte, artifacts map[string][]byte) error
	// Release returns the document of version (ErrNotFound).
	Release(version string) ([]byte, error)
	// ReleaseArtifact returns the binary whose SHA-256 is sum (ErrNotFound).
	ReleaseArtifact(sum string) ([]byte, error)
	// ReleaseVersions lists the stored versions.
	ReleaseVersions() ([]string, error)
}
