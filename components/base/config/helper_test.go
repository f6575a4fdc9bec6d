package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestHelperSection(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Helper
		wantErr string // substring; empty means success
	}{
		{
			name: "socket and user",
			in:   "[helper]\nsocket = \"/run/bcd-helper/helper.sock\"\nuser = \"bcd\"\n",
			want: Helper{Socket: "/run/bcd-helper/helper.sock", User: "bcd"},
		},
		{
			name: "with entrypoint",
			in:   "[helper]\nsocket = \"/run/bcd-helper/helper.sock\"\nuser = \"bcd\"\nentrypoint = \"/usr/local/bin/bcd-node\"\n",
			want: Helper{Socket: "/run/bcd-helper/helper.sock", User: "bcd", Entrypoint: "/usr/local/bin/bcd-node"},
		},
		{
			name:    "relative entrypoint",
			in:      "[helper]\nsocket = \"/run/h.sock\"\nuser = \"bcd\"\nentrypoint = \"bin/bcd-node\"\n",
			wantErr: "helper.entrypoint: must be an absolute, clean path",
		},
		{
			name:    "unclean entrypoint",
			in:      "[helper]\nsocket = \"/run/h.sock\"\nuser = \"bcd\"\nentrypoint = \"/usr/local/../bin/bcd-node\"\n",
			wantErr: "helper.entrypoint: must be an absolute, clean path",
		},
		{
			name:    "unknown helper key still refused",
			in:      "[helper]\nsocket = \"/run/h.sock\"\nuser = \"bcd\"\nentrypoints = \"/bin/bcd\"\n",
			wantErr: `unknown key "helper.entrypoints"`,
		},
		{
			name:    "entrypoint spelt in another case refused",
			in:      "[helper]\nsocket = \"/run/h.sock\"\nuser = \"bcd\"\nEntrypoint = \"/bin/bcd\"\n",
			wantErr: `unknown key "helper.Entrypoint"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.in), "/etc/bcd/config.toml")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Helper, tt.want) {
				t.Errorf("helper = %+v, want %+v", c.Helper, tt.want)
			}
		})
	}
}

func TestHelperEntrypointRoundTrip(t *testing.T) {
	in := Config{
		Gateway: "https://gw.example.com", DataDir: "/var/lib/bcd", SocketPath: "/run/bcd/bcd.sock",
		Log:    Log{Level: "info", Format: "json"},
		Helper: Helper{Socket: "/run/bcd-helper/helper.sock", User: "bcd", Entrypoint: "/usr/local/bin/bcd-node"},
	}
	data, err := in.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `entrypoint = "/usr/local/bin/bcd-node"`) {
		t.Errorf("output lacks the entrypoint:\n%s", data)
	}
	got, err := Parse(data, "x.toml")
	if err != nil {
		t.Fatal(err)
	}
	in.Path = "x.toml"
	if !reflect.DeepEqual(*got, in) {
		t.Errorf("round trip:\n got %+v\nwant %+v", *got, in)
	}
}
