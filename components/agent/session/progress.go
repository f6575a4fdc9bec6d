package session

import (
	"context"
	"encoding/json"
	"time"

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// MaxProgressDetail bounds a CommandProgress's JSON.
const MaxProgressDetail = 4 << 10

// Progress sends a CommandProgress for a running command if a session is
// up and the outbox has room; otherwise it is dropped (the next one
// replaces it). It never blocks the command.
func (s *Session) Progress(commandID string, detail []byte) {
	if commandID == "" || len(detail) > MaxProgressDetail {
		return
	}
	f := &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Progress{Progress: &bcdv1.CommandProgress{
		CommandId: commandID, Detail: append([]byte(nil), detail...), AtUnixMs: time.Now().UnixMilli()}}}
	select {
	case s.outbox <- f:
	default:
	}
}

// progresser is what ReportProgress needs of the value WithSecrets put in
// the context (a *Session).
type progresser interface {
	Progress(commandID string, detail []byte)
}

// ReportProgress reports v (encoded as JSON) as the progress of the
// command commandID, through the session the context carries; without
// one it does nothing. Callers pace it (at most about once a second).
func ReportProgress(ctx context.Context, commandID string, v any) {
	p, _ := ctx.Value(secretsKey{}).(progresser)
	if p == nil || commandID == "" {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	p.Progress(commandID, b)
}
