package pki

import (
	"net/url"
	"strings"
	"testing"
)

func TestSPIFFEID(t *testing.T) {
	u := SPIFFEID("lab.example", "agent", "node-1")
	if got, want := u.String(), "spiffe://lab.example/agent/node-1"; got != want {
		t.Fatalf("SPIFFEID = %q, want %q", got, want)
	}
	td, role, node, err := ParseSPIFFEID(u)
	if err != nil || td != "lab.example" || role != "agent" || node != "node-1" {
		t.Fatalf("ParseSPIFFEID = %q %q %q %v", td, role, node, err)
	}
}

func TestParseSPIFFEID(t *testing.T) {
	tests := []struct {
		in      string
		td      string
		role    string
		node    string
		wantErr string
	}{
		{in: "spiffe://lab.example/agent/node-1", td: "lab.example", role: "agent", node: "node-1"},
		{in: "SPIFFE://lab_1.example/Agent/Node.A_b-c", td: "lab_1.example", role: "Agent", node: "Node.A_b-c"},
		{in: "https://lab.example/agent/node-1", wantErr: "scheme"},
		{in: "spiffe:lab.example/agent/node-1", wantErr: "must be spiffe://"},
		{in: "spiffe://user@lab.example/agent/node-1", wantErr: "must be spiffe://"},
		{in: "spiffe://lab.example/agent/node-1?x=1", wantErr: "must be spiffe://"},
		{in: "spiffe://lab.example/agent/node-1?", wantErr: "must be spiffe://"},
		{in: "spiffe://lab.example/agent/node-1#f", wantErr: "must be spiffe://"},
		{in: "spiffe://lab.example/agent/node%2F1", wantErr: "must be spiffe://"},
		{in: "spiffe://lab.example:8443/agent/node-1", wantErr: "trust domain"},
		{in: "spiffe://Lab.example/agent/node-1", wantErr: "trust domain"},
		{in: "spiffe:///agent/node-1", wantErr: "trust domain"},
		{in: "spiffe://lab.example", wantErr: "missing path"},
		{in: "spiffe://lab.example/agent", wantErr: "path must be"},
		{in: "spiffe://lab.example/agent/node/extra", wantErr: "path must be"},
		{in: "spiffe://lab.example/agent/node-1/", wantErr: "path must be"},
		{in: "spiffe://lab.example//node-1", wantErr: "role"},
		{in: "spiffe://lab.example/agent/", wantErr: "node ID"},
		{in: "spiffe://lab.example/../node-1", wantErr: "role"},
		{in: "spiffe://lab.example/agent/..", wantErr: "node ID"},
		{in: "spiffe://lab.example/agent/node 1", wantErr: "must be spiffe://"},
		{in: "spiffe://lab.example/agent/" + strings.Repeat("a", 256), wantErr: "node ID"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			u, err := url.Parse(tc.in)
			if err != nil {
				t.Fatalf("url.Parse: %v", err)
			}
			td, role, node, err := ParseSPIFFEID(u)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSPIFFEID: %v", err)
			}
			if td != tc.td || role != tc.role || node != tc.node {
				t.Fatalf("got %q %q %q, want %q %q %q", td, role, node, tc.td, tc.role, tc.node)
			}
		})
	}
	// SPIFFEID does not validate; ParseSPIFFEID must catch what it builds.
	for _, u := range []*url.URL{
		SPIFFEID("lab.example", "agent", "node 1"),
		SPIFFEID("lab.example", "", "node-1"),
		SPIFFEID("LAB", "agent", "node-1"),
		SPIFFEID("lab.example", "agent", "a/b"),
	} {
		if _, _, _, err := ParseSPIFFEID(u); err == nil {
			t.Fatalf("ParseSPIFFEID(%q) succeeded", u.String())
		}
	}
	if _, _, _, err := ParseSPIFFEID(nil); err == nil {
		t.Fatal("nil URL accepted")
	}
}
