package session_test

import (
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/journal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// FuzzGatewayFrame decodes arbitrary bytes as the frames a gateway sends
// and hands any command to a real dispatcher over a journal: nothing may
// panic, and a command that is not well-formed is refused, never run.
func FuzzGatewayFrame(f *testing.F) {
	for _, fr := range []*bcdv1.GatewayFrame{
		{Frame: &bcdv1.GatewayFrame_Welcome{Welcome: &bcdv1.Welcome{Epoch: 3, ServerTimeUnixMs: 1}}},
		{Frame: &bcdv1.GatewayFrame_Command{Command: &bcdv1.Command{Id: "c1", NodeId: "n1", Kind: "k", Body: []byte(`{}`)}}},
		{Frame: &bcdv1.GatewayFrame_Ack{Ack: &bcdv1.Ack{ResultIds: []string{"c1"}}}},
		{Frame: &bcdv1.GatewayFrame_Drain{Drain: &bcdv1.Drain{RedialAfterMs: 5}}},
	} {
		b, _ := proto.Marshal(fr)
		f.Add(b)
	}
	j, _, err := journal.Open(filepath.Join(f.TempDir(), journal.File), "n1")
	if err != nil {
		f.Fatal(err)
	}
	d, err := dispatch.New(dispatch.Config{NodeID: "n1", Journal: j})
	if err != nil {
		f.Fatal(err)
	}
	if err := d.Recover(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fr bcdv1.GatewayFrame
		if proto.Unmarshal(b, &fr) != nil {
			return
		}
		var af bcdv1.AgentFrame
		_ = proto.Unmarshal(b, &af)
		if c := fr.GetCommand(); c != nil && c.GetId() != "" {
			c.DeadlineUnixMs = time.Now().Add(time.Minute).UnixMilli()
			if err := d.Deliver(c); err != nil {
				return
			}
			// No kinds are registered: every command is refused.
			for _, r := range d.Unacked() {
				if r.GetStatus() != dispatch.Unsupported && r.GetStatus() != dispatch.Refused {
					t.Fatalf("a command ran: %v", r)
				}
			}
			d.Acked([]string{c.GetId()})
		}
	})
}
