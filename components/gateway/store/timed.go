package store

import (
	"context"
	"time"
)

// Timed is st with each Store operation's latency given to observe (by
// the method's name), for the gateway's metrics (docs/bcgw.md, "Metrics").
// What st also implements of Shared and Releases is kept, untimed: the
// gateway finds those by type assertion.
func Timed(st Store, observe func(op string, d time.Duration)) Store {
	t := &timed{s: st, observe: observe}
	sh, isShared := st.(Shared)
	rel, isReleases := st.(Releases)
	switch {
	case isShared && isReleases:
		return struct {
			*timed
			Shared
			Releases
		}{t, sh, rel}
	case isShared:
		return struct {
			*timed
			Shared
		}{t, sh}
	case isReleases:
		return struct {
			*timed
			Releases
		}{t, rel}
	}
	return t
}

type timed struct {
	s       Store
	observe func(op string, d time.Duration)
}

func (x *timed) since(op string, start time.Time) { x.observe(op, time.Since(start)) }

func (x *timed) Close() error { return x.s.Close() }

func (x *timed) Ping(ctx context.Context) error {
	defer x.since("Ping", time.Now())
	return x.s.Ping(ctx)
}

func (x *timed) PutToken(t Token) error {
	defer x.since("PutToken", time.Now())
	return x.s.PutToken(t)
}

func (x *timed) DeleteToken(id string) error {
	defer x.since("DeleteToken", time.Now())
	return x.s.DeleteToken(id)
}

func (x *timed) SpendToken(id, secret, role string, now time.Time) (Token, error) {
	defer x.since("SpendToken", time.Now())
	return x.s.SpendToken(id, secret, role, now)
}

func (x *timed) SpendTokenIf(id, secret, role string, now time.Time, check func(Token) error) (Token, error) {
	defer x.since("SpendTokenIf", time.Now())
	return x.s.SpendTokenIf(id, secret, role, now, check)
}

func (x *timed) PutNode(n Node) error {
	defer x.since("PutNode", time.Now())
	return x.s.PutNode(n)
}

func (x *timed) Node(id string) (Node, error) {
	defer x.since("Node", time.Now())
	return x.s.Node(id)
}

func (x *timed) Nodes() ([]Node, error) {
	defer x.since("Nodes", time.Now())
	return x.s.Nodes()
}

func (x *timed) UpdateNode(id string, f func(*Node) error) (Node, error) {
	defer x.since("UpdateNode", time.Now())
	return x.s.UpdateNode(id, f)
}

func (x *timed) StartSession(nodeID string, f func(*Node) error) (Node, error) {
	defer x.since("StartSession", time.Now())
	return x.s.StartSession(nodeID, f)
}

func (x *timed) SessionState(nodeID string) (SessionState, error) {
	defer x.since("SessionState", time.Now())
	return x.s.SessionState(nodeID)
}

func (x *timed) AddCommand(c Command) error {
	defer x.since("AddCommand", time.Now())
	return x.s.AddCommand(c)
}

func (x *timed) Command(id string) (Command, error) {
	defer x.since("Command", time.Now())
	return x.s.Command(id)
}

func (x *timed) Unfinished(nodeID string) ([]Command, error) {
	defer x.since("Unfinished", time.Now())
	return x.s.Unfinished(nodeID)
}

func (x *timed) MarkDelivered(nodeID, id string) error {
	defer x.since("MarkDelivered", time.Now())
	return x.s.MarkDelivered(nodeID, id)
}

func (x *timed) SetResult(nodeID, id string, r Result) (bool, error) {
	defer x.since("SetResult", time.Now())
	return x.s.SetResult(nodeID, id, r)
}

func (x *timed) CancelPending(id, reason string, now time.Time) (Command, bool, error) {
	defer x.since("CancelPending", time.Now())
	return x.s.CancelPending(id, reason, now)
}

func (x *timed) Meta(key string) ([]byte, error) {
	defer x.since("Meta", time.Now())
	return x.s.Meta(key)
}

func (x *timed) SetMeta(key string, v []byte) error {
	defer x.since("SetMeta", time.Now())
	return x.s.SetMeta(key, v)
}

func (x *timed) SwapMeta(key string, old, v []byte) (bool, error) {
	defer x.since("SwapMeta", time.Now())
	return x.s.SwapMeta(key, old, v)
}

func (x *timed) DeleteMeta(key string) error {
	defer x.since("DeleteMeta", time.Now())
	return x.s.DeleteMeta(key)
}

func (x *timed) MetaPrefix(prefix string) (map[string][]byte, error) {
	defer x.since("MetaPrefix", time.Now())
	return x.s.MetaPrefix(prefix)
}

func (x *timed) DeleteMetaPrefix(prefix string) error {
	defer x.since("DeleteMetaPrefix", time.Now())
	return x.s.DeleteMetaPrefix(prefix)
}

func (x *timed) Spec(nodeID string) (Spec, error) {
	defer x.since("Spec", time.Now())
	return x.s.Spec(nodeID)
}

func (x *timed) PutSpec(nodeID string, base uint64, spec []byte, at time.Time) (Spec, error) {
	defer x.since("PutSpec", time.Now())
	return x.s.PutSpec(nodeID, base, spec, at)
}

func (x *timed) PutSubmittedSpec(nodeID string, base uint64, spec, sig []byte, at time.Time) (Spec, error) {
	defer x.since("PutSubmittedSpec", time.Now())
	return x.s.PutSubmittedSpec(nodeID, base, spec, sig, at)
}

func (x *timed) PutReport(nodeID string, rec []byte) error {
	defer x.since("PutReport", time.Now())
	return x.s.PutReport(nodeID, rec)
}

func (x *timed) Report(nodeID string) ([]byte, error) {
	defer x.since("Report", time.Now())
	return x.s.Report(nodeID)
}

func (x *timed) AddEvent(nodeID string, e Event, keep int) (bool, error) {
	defer x.since("AddEvent", time.Now())
	return x.s.AddEvent(nodeID, e, keep)
}

func (x *timed) Events(nodeID string, after uint64) ([]Event, error) {
	defer x.since("Events", time.Now())
	return x.s.Events(nodeID, after)
}

func (x *timed) DeleteEvents(nodeID string) error {
	defer x.since("DeleteEvents", time.Now())
	return x.s.DeleteEvents(nodeID)
}

func (x *timed) RecentCommands(limit int) ([]Command, error) {
	defer x.since("RecentCommands", time.Now())
	return x.s.RecentCommands(limit)
}

func (x *timed) Tokens() ([]Token, error) {
	defer x.since("Tokens", time.Now())
	return x.s.Tokens()
}

func (x *timed) DeleteNode(id string) error {
	defer x.since("DeleteNode", time.Now())
	return x.s.DeleteNode(id)
}

func (x *timed) AddAudit(e AuditEntry) (AuditEntry, error) {
	defer x.since("AddAudit", time.Now())
	return x.s.AddAudit(e)
}

func (x *timed) Audit(after uint64, limit int) ([]AuditEntry, error) {
	defer x.since("Audit", time.Now())
	return x.s.Audit(after, limit)
}
