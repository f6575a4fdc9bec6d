package spec

import (
	"encoding/json"
	"strings"
	"testing"
)

const (
	sumA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	sumB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	pin  = "sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
)

// good is a section every case edits one thing of.
func good() string {
	return `{"images":[{"sha256":"` + sumA + `","url":"https://img.example/debian.qcow2","format":"qcow2","spki_pin":"` + pin + `"},
	                   {"sha256":"` + sumB + `","url":"https://img.example/install.iso","format":"iso"}],
	         "instances":[{"id":"vm-1","allocation":"alloc_a","state":"RUNNING","vcpus":2,"memory_mib":2048,"image":"` + sumA + `","user_data":true,"hostname":"web1","gpus":["GPU-5f1c0a2b"],
	                       "nics":[{"bridge":"br0","mac":"52:54:00:00:00:01","addresses":["10.9.0.5/24","fd09::5/64"],"policy":"PRIVATE"}]},
	                      {"id":"vm_2","allocation":"alloc_a","state":"STOPPED","vcpus":1,"memory_mib":512,"image":"` + sumB + `","disk_gib":10,
	                       "nics":[{"bridge":"br0","mac":"52:54:00:00:00:02","policy":"EGRESS"}]}]}`
}

func TestDecode(t *testing.T) {
	for _, tt := range []struct {
		name, from, to, wantErr string
	}{
		{name: "good"},
		{name: "empty", from: good(), to: `{}`},
		{name: "unknown field", from: `"hostname":"web1"`, to: `"hostname":"web1","cmdline":"x"`, wantErr: `unknown field "cmdline"`},
		{name: "second value", from: good(), to: good() + `{}`, wantErr: "data after"},
		{name: "wrong type", from: `"vcpus":2`, to: `"vcpus":"2"`, wantErr: "cannot unmarshal"},
		{name: "http image", from: "https://img.example/debian", to: "http://img.example/debian", wantErr: "https://"},
		{name: "file image", from: "https://img.example/debian.qcow2", to: "file:///etc/shadow", wantErr: "https://"},
		{name: "digest upper", from: `"sha256":"` + sumA, to: `"sha256":"` + strings.ToUpper(sumA), wantErr: "64 lowercase hex"},
		{name: "digest twice", from: `"sha256":"` + sumB, to: `"sha256":"` + sumA, wantErr: "named twice"},
		{name: "format vmdk", from: `"format":"qcow2"`, to: `"format":"vmdk"`, wantErr: "not qcow2, raw or iso"},
		{name: "bad pin", from: pin, to: "sha256/abc", wantErr: "spki_pin"},
		{name: "id slash", from: `"id":"vm-1"`, to: `"id":"../etc"`, wantErr: "id"},
		{name: "id long", from: `"id":"vm-1"`, to: `"id":"` + strings.Repeat("a", 65) + `"`, wantErr: "1 to 64"},
		{name: "id twice", from: `"id":"vm_2"`, to: `"id":"vm-1"`, wantErr: "named twice"},
		{name: "no allocation", from: `"allocation":"alloc_a","state":"RUNNING"`, to: `"state":"RUNNING"`, wantErr: "allocation"},
		{name: "state lower", from: `"state":"RUNNING"`, to: `"state":"running"`, wantErr: "RUNNING, PAUSED or STOPPED"},
		{name: "paused", from: `"state":"RUNNING"`, to: `"state":"PAUSED"`},
		{name: "no vcpus", from: `"vcpus":2,`, to: ``, wantErr: "vcpus 0"},
		{name: "small memory", from: `"memory_mib":2048`, to: `"memory_mib":16`, wantErr: "memory_mib"},
		{name: "negative disk", from: `"disk_gib":10`, to: `"disk_gib":-1`, wantErr: "disk_gib"},
		{name: "iso without disk", from: `,"disk_gib":10`, to: ``, wantErr: "is an iso"},
		{name: "unknown image", from: `"image":"` + sumB, to: `"image":"` + strings.Repeat("c", 64), wantErr: "not the sha256 of an entry"},
		{name: "hostname dot", from: `"hostname":"web1"`, to: `"hostname":"web1.example"`, wantErr: "DNS label"},
		{name: "MIG passthrough", from: `"GPU-5f1c0a2b"`, to: `"MIG-5f1c0a2b"`, wantErr: "not a GPU UUID"},
		{name: "GPU index", from: `"GPU-5f1c0a2b"`, to: `"3"`, wantErr: "not a GPU UUID"},
		{name: "GPU twice", from: `"GPU-5f1c0a2b"`, to: `"GPU-5f1c0a2b","GPU-5F1C0A2B"`, wantErr: "named twice"},
		{name: "NIC policy NONE", from: `"policy":"PRIVATE"`, to: `"policy":"NONE"`},
		{name: "NIC policy lower", from: `"policy":"PRIVATE"`, to: `"policy":"private"`, wantErr: "not EGRESS, PRIVATE or NONE"},
		{name: "NIC NONE without addresses", from: `"policy":"EGRESS"`, to: `"policy":"NONE"`, wantErr: "cannot be expressed"},
		{name: "NIC rules", from: `"policy":"EGRESS"`, to: `"policy":"EGRESS","rules":"accept"`, wantErr: `unknown field "rules"`},
		{name: "NIC bridge quote", from: `"bridge":"br0"`, to: `"bridge":"br0\" accept"`, wantErr: "not an interface name"},
		{name: "NIC MAC upper", from: `52:54:00:00:00:01`, to: `52:54:00:00:00:0A`, wantErr: "mac"},
		{name: "NIC MAC multicast", from: `52:54:00:00:00:01`, to: `01:00:5e:00:00:01`, wantErr: "mac"},
		{name: "NIC address without prefix", from: `"10.9.0.5/24"`, to: `"10.9.0.5"`, wantErr: "prefix length"},
		{name: "NIC address twice", from: `"fd09::5/64"`, to: `"10.9.0.5/16"`, wantErr: "given twice"},
		{name: "NIC loopback", from: `"10.9.0.5/24"`, to: `"127.0.0.5/8"`, wantErr: "unicast"},
		{name: "NIC MAC in two instances", from: `52:54:00:00:00:02`, to: `52:54:00:00:00:01`, wantErr: "mac 52:54:00:00:00:01 is also instance vm-1's"},
		{name: "NIC address in two instances", from: `"mac":"52:54:00:00:00:02","policy"`, to: `"mac":"52:54:00:00:00:02","addresses":["10.9.0.5/24"],"policy"`, wantErr: "address 10.9.0.5 is also instance vm-1's"},
		{name: "restore", from: `"image":"` + sumB + `","disk_gib":10,`, to: `"restore_from":{"url":"https://snap.example/s.tar","sha256":"` + sumB + `","memory":true,"spki_pin":"` + pin + `"},`},
		{name: "restore over http", from: `"image":"` + sumB + `","disk_gib":10,`, to: `"restore_from":{"url":"http://snap.example/s.tar?sig=x","sha256":"` + sumB + `"},`, wantErr: "restore_from: url"},
		{name: "restore without digest", from: `"image":"` + sumB + `","disk_gib":10,`, to: `"restore_from":{"url":"https://snap.example/s.tar"},`, wantErr: "restore_from: sha256"},
		{name: "restore and image", from: `"disk_gib":10,`, to: `"restore_from":{"url":"https://snap.example/s.tar","sha256":"` + sumB + `"},`, wantErr: "give no image"},
		{name: "restore bad pin", from: `"image":"` + sumB + `","disk_gib":10,`, to: `"restore_from":{"url":"https://snap.example/s.tar","sha256":"` + sumB + `","spki_pin":"x"},`, wantErr: "restore_from: spki_pin"},
		{name: "restore unknown field", from: `"image":"` + sumB + `","disk_gib":10,`, to: `"restore_from":{"url":"https://snap.example/s.tar","sha256":"` + sumB + `","path":"/etc"},`, wantErr: `unknown field "path"`},
		{name: "GPU in two instances", from: `"disk_gib":10`, to: `"disk_gib":10,"gpus":["GPU-5f1c0a2b"]`, wantErr: "also instance vm-1's"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := good()
			if tt.from != "" {
				if !strings.Contains(in, tt.from) {
					t.Fatalf("case edits %q, which the good section lacks", tt.from)
				}
				in = strings.Replace(in, tt.from, tt.to, 1)
			}
			_, err := Decode(json.RawMessage(in))
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Decode = %v, want %q", err, tt.wantErr)
			}
		})
	}
	if b, err := Decode(nil); err != nil || len(b.Instances) != 0 {
		t.Errorf("Decode(nil) = %+v, %v: want an empty section", b, err)
	}
}

// TestURLRedacted: a refused URL's query (a presigned signature) never
// reaches the error.
func TestURLRedacted(t *testing.T) {
	in := strings.Replace(good(), "https://img.example/debian.qcow2", "ftp://img.example/d?X-Sig=s3cr3t", 1)
	_, err := Decode(json.RawMessage(in))
	if err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("Decode = %v: want a refusal without the query", err)
	}
}

// FuzzDecode: Decode never panics, and a section it accepts, encoded
// again, is accepted again.
func FuzzDecode(f *testing.F) {
	f.Add(good())
	f.Add(`{}`)
	f.Add(`{"instances":[{"id":"a"}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		b, err := Decode(json.RawMessage(s))
		if err != nil {
			return
		}
		out, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(out); err != nil {
			t.Fatalf("re-encoded section refused: %v\n%s", err, out)
		}
	})
}
