package agent

import (
	"crypto"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// eventLog is the session's EventLog over the journal's event log: events
// are fsynced before they are sent, re-sent until acked, and survive a
// restart.
type eventLog struct {
	j      *journal.Journal
	notify chan struct{}
	// nodeID and nodeKey sign the events a control plane must be able to
	// prove came from this machine (Allocation*): nil key, none signed.
	nodeID  string
	nodeKey func() crypto.Signer
}

func newEventLog(j *journal.Journal, nodeID string, nodeKey func() crypto.Signer) *eventLog {
	return &eventLog{j: j, notify: make(chan struct{}, 1), nodeID: nodeID, nodeKey: nodeKey}
}

// PurposeEvent is the purpose of a node's signature of an event.
const PurposeEvent = "bcd/event/v1"

// signedEvent is the body of a node-signed event: the event's own body,
// and the node key's signature over {"node_id", "type", "body"}.
type signedEvent struct {
	Body          json.RawMessage `json:"body"`
	NodeSignature []byte          `json:"node_signature"`
}

// EventMessage is what a node signs of an event of type typ with body.
func EventMessage(nodeID, typ string, body []byte) []byte {
	b, _ := json.Marshal(struct {
		NodeID string          `json:"node_id"`
		Type   string          `json:"type"`
		Body   json.RawMessage `json:"body"`
	}{nodeID, typ, body})
	return b
}

// Append records an event with a JSON body; an Allocation* event is
// signed by the node key.
func (l *eventLog) Append(typ string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	if strings.HasPrefix(typ, "Allocation") && l.nodeKey != nil {
		if k := l.nodeKey(); k != nil {
			sig, err := pki.Sign(k, PurposeEvent, EventMessage(l.nodeID, typ, b))
			if err != nil {
				return fmt.Errorf("signing event %s: %w", typ, err)
			}
			if b, err = json.Marshal(signedEvent{Body: b, NodeSignature: sig}); err != nil {
				return err
			}
		}
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
