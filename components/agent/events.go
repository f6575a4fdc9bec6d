package agent

import (
	"encoding/json"

	"github.com/better-compute/bcd/components/agent/journal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// eventLog is the session's EventLog over the journal's event log: events
// are fsynced before they are sent, re-sent until acked, and survive a
// restart.
type eventLog struct {
	j      *journal.Journal
	notify chan struct{}
}

func newEventLog(j *journal.Journal) *eventLog {
	return &eventLog{j: j, notify: make(chan struct{}, 1)}
}

// Append records an event with a JSON body.
func (l *eventLog) Append(typ string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	if _, err := l.j.AppendEvent(typ, b); err != nil {
		return err
	}
	select {
	case l.notify <- struct{}{}:
	default:
	}
	return nil
}

func (l *eventLog) Unacked() ([]*bcdv1.Event, error) {
	evs, _, err := l.j.Events()
	if err != nil {
		return nil, err
	}
	out := make([]*bcdv1.Event, 0, len(evs))
	for _, e := range evs {
		out = append(out, &bcdv1.Event{Seq: e.Seq, Type: e.Type, Body: e.Body, AtUnixMs: e.At.UnixMilli()})
	}
	return out, nil
}

func (l *eventLog) LastAcked() uint64 {
	_, acked, _ := l.j.Events()
	return acked
}

func (l *eventLog) Ack(seq uint64) error { return l.j.AckEvents(seq) }

func (l *eventLog) Notify() <-chan struct{} { return l.notify }
