package pgstore

import "time"

// SetOwnerWait shortens the wait for a held database in tests.
func SetOwnerWait(d time.Duration) (restore func()) {
	old := ownerWait
	ownerWait = d
	return func() { ownerWait = old }
}
