package store

import (
	"errors"
	"fmt"
)

// UpdateMeta changes key's value by compare-and-swap: f is given the
// stored value (nil when there is none) and returns the value to write in
// its place, or nil to write nothing. When another writer changed the
// value between the read and the write (SwapMeta lost), the value is read
// again and f applied again, at most tries times. Several gateways on one
// store update a counter or a record this way without a lock.
func UpdateMeta(s Store, key string, tries int, f func(old []byte) ([]byte, error)) error {
	for range tries {
		old, err := s.Meta(key)
		if errors.Is(err, ErrNotFound) {
			old, err = nil, nil
		}
		if err != nil {
			return err
		}
		v, err := f(old)
		if err != nil || v == nil {
			return err
		}
		if ok, err := s.SwapMeta(key, old, v); ok || err != nil {
			return err
		}
	}
	return fmt.Errorf("%s: other writers changed it %d times in a row; try again", key, tries)
}
