package helperclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/release"
	"github.com/better-compute/bcd/components/trust/selfupdate"
)

// Updater is the helper's update.* operations as a selfupdate.Installer
// (the node's update.Installer): under [helper] the slots, the floor and
// the checks are root's, and the node only downloads and restarts. A
// refusal the helper flags final comes back as a *release.FinalError
// wrapping the *Error, so release.IsFinal holds; other failures are
// *Error as usual.
func (c *Client) Updater() selfupdate.Installer { return updater{c} }

type updater struct{ c *Client }

var _ selfupdate.Installer = updater{}

// call sends op (with doc for prepare and swap) and decodes the answer's
// update object strictly into v (nil: none expected).
func (u updater) call(ctx context.Context, op string, doc []byte, v any) error {
	resp, err := u.c.Do(ctx, &wire.Request{V: wire.Version, Op: op, Document: doc})
	if err != nil {
		var e *Error
		if resp != nil && resp.Final && errors.As(err, &e) {
			return &release.FinalError{Err: e}
		}
		return err
	}
	if v == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(resp.Update))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("bcd helper at %s: %s: the answer's update: %w", u.c.Socket, op, err)
	}
	return nil
}

func (u updater) Status(ctx context.Context) (selfupdate.State, error) {
	var st selfupdate.State
	err := u.call(ctx, wire.OpUpdateStatus, nil, &st)
	return st, err
}

func (u updater) Prepare(ctx context.Context, doc []byte) (selfupdate.Prepared, error) {
	var p selfupdate.Prepared
	if err := checkDoc(doc); err != nil {
		return p, err
	}
	err := u.call(ctx, wire.OpUpdatePrepare, doc, &p)
	return p, err
}

func (u updater) Swap(ctx context.Context, doc []byte) (selfupdate.Upgrade, error) {
	var up selfupdate.Upgrade
	if err := checkDoc(doc); err != nil {
		return up, err
	}
	err := u.call(ctx, wire.OpUpdateSwap, doc, &up)
	return up, err
}

func (u updater) Confirm(ctx context.Context) (bool, error) {
	var a wire.UpdateConfirmed
	err := u.call(ctx, wire.OpUpdateConfirm, nil, &a)
	return a.Confirmed, err
}

func (u updater) Settle(ctx context.Context) (string, error) {
	var a wire.UpdateRolledBack
	err := u.call(ctx, wire.OpUpdateSettle, nil, &a)
	return a.RolledBack, err
}

func (u updater) Rollback(ctx context.Context) (string, error) {
	var a wire.UpdateRolledBack
	err := u.call(ctx, wire.OpUpdateRollback, nil, &a)
	return a.RolledBack, err
}

func (u updater) ClearFailed(ctx context.Context) error {
	return u.call(ctx, wire.OpUpdateClearFailed, nil, nil)
}

// checkDoc refuses, as final, a document no helper takes (empty or
// larger than release.MaxDocument), before anything is sent.
func checkDoc(doc []byte) error {
	if len(doc) == 0 || len(doc) > release.MaxDocument {
		return &release.FinalError{Err: fmt.Errorf("the document is %d bytes: 1 to %d", len(doc), release.MaxDocument)}
	}
	return nil
}
