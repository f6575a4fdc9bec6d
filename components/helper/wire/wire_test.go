package wire

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeRequest(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // substring; empty means success
		want    *Request
	}{
		{name: "file.write", in: `{"v":1,"op":"file.write","kind":"cdi","id":"x","data":"aGk="}`,
			want: &Request{V: 1, Op: "file.write", Kind: "cdi", ID: "x", Data: []byte("hi")}},
		{name: "whitespace around", in: " \n{\"v\":1,\"op\":\"ssh.reload\"}\n\t ", want: &Request{V: 1, Op: "ssh.reload"}},
		{name: "rules", in: `{"v":1,"op":"firewall.check","rules":12}`, want: &Request{V: 1, Op: "firewall.check", Rules: ptr(int64(12))}},
		{name: "unknown field", in: `{"v":1,"op":"file.write","kind":"cdi","id":"x","path":"/etc/passwd"}`, wantErr: `unknown field "path"`},
		{name: "field in another case", in: `{"v":1,"OP":"file.write"}`, wantErr: `unknown field "OP"`},
		{name: "field twice", in: `{"v":1,"op":"file.remove","op":"file.write"}`, wantErr: `field "op" given twice`},
		{name: "other version", in: `{"v":2,"op":"file.write"}`, wantErr: "protocol version 2"},
		{name: "version 0", in: `{"v":0,"op":"file.write"}`, wantErr: "protocol version 0"},
		{name: "no version", in: `{"op":"file.write"}`, wantErr: `no field "v"`},
		{name: "no op", in: `{"v":1}`, wantErr: `no field "op"`},
		{name: "version as a string", in: `{"v":"1","op":"x"}`, wantErr: `field "v" has the wrong type`},
		{name: "version not an integer", in: `{"v":1.0,"op":"x"}`, wantErr: "request"},
		{name: "null", in: `{"v":1,"op":"file.write","kind":null}`, wantErr: `field "kind" has the wrong type`},
		{name: "nested", in: `{"v":1,"op":{"a":1}}`, wantErr: "wrong type"},
		{name: "array", in: `[{"v":1,"op":"x"}]`, wantErr: "not a JSON object"},
		{name: "two values", in: `{"v":1,"op":"ssh.reload"}{"v":1,"op":"reboot"}`, wantErr: "more than one JSON value"},
		{name: "trailing garbage", in: `{"v":1,"op":"ssh.reload"} x`, wantErr: "more than one JSON value"},
		{name: "empty", in: ``, wantErr: "not JSON"},
		{name: "truncated", in: `{"v":1,"op":"ssh.re`, wantErr: "not JSON"},
		{name: "bad base64", in: `{"v":1,"op":"file.write","kind":"cdi","id":"x","data":"!!"}`, wantErr: "request"},
		{name: "too large", in: `{"v":1,"op":"ssh.reload"}` + strings.Repeat(" ", MaxRequest), wantErr: "larger than 4194304 bytes"},
		{name: "exactly the limit", in: `{"v":1,"op":"ssh.reload"}` + strings.Repeat(" ", MaxRequest-len(`{"v":1,"op":"ssh.reload"}`)), want: &Request{V: 1, Op: "ssh.reload"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeRequest([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 1<<20+1)
	tests := []struct {
		name    string
		r       Request
		wantErr string
	}{
		{name: "file.write", r: Request{Op: OpFileWrite, Kind: "cdi", ID: "a"}},
		{name: "file.write k8s-token", r: Request{Op: OpFileWrite, Kind: "k8s-token", Data: []byte("t")}},
		{name: "file.remove", r: Request{Op: OpFileRemove, Kind: "ssh-ca"}},
		{name: "unknown op", r: Request{Op: "file.chmod"}, wantErr: `unknown operation "file.chmod"`},
		{name: "file kind unknown", r: Request{Op: OpFileWrite, Kind: "passwd"}, wantErr: "not in bcd helper's file table"},
		{name: "file id outside", r: Request{Op: OpFileWrite, Kind: "cdi", ID: "../x"}, wantErr: "not in bcd helper's file table"},
		{name: "file too large", r: Request{Op: OpFileWrite, Kind: "cdi", ID: "a", Data: big}, wantErr: "more than 1048576"},
		{name: "remove with data", r: Request{Op: OpFileRemove, Kind: "cdi", ID: "a", Data: []byte("x")}, wantErr: "file.remove takes no data"},
		{name: "write with ruleset", r: Request{Op: OpFileWrite, Kind: "cdi", ID: "a", Ruleset: "x"}, wantErr: "takes no ruleset"},
		{name: "apply", r: Request{Op: OpFirewallApply, Ruleset: "table inet bcd_taps"}},
		{name: "apply empty", r: Request{Op: OpFirewallApply}, wantErr: "no ruleset"},
		{name: "apply too large", r: Request{Op: OpFirewallApply, Ruleset: strings.Repeat("#", MaxRuleset+1)}, wantErr: "more than"},
		{name: "check", r: Request{Op: OpFirewallCheck, Rules: ptr(int64(0))}},
		{name: "check max", r: Request{Op: OpFirewallCheck, Rules: ptr(int64(MaxRuleCount))}},
		{name: "check no count", r: Request{Op: OpFirewallCheck}, wantErr: "rules must be a count"},
		{name: "check negative", r: Request{Op: OpFirewallCheck, Rules: ptr(int64(-1))}, wantErr: "rules must be a count"},
		{name: "check too many", r: Request{Op: OpFirewallCheck, Rules: ptr(int64(MaxRuleCount + 1))}, wantErr: "rules must be a count"},
		{name: "reboot", r: Request{Op: OpReboot, Reason: "kernel update"}},
		{name: "reboot with kind", r: Request{Op: OpReboot, Kind: "cdi"}, wantErr: "reboot takes no kind"},
		{name: "ssh.reload with reason", r: Request{Op: OpSSHReload, Reason: "x"}, wantErr: "takes no reason"},
		{name: "gpu.reset", r: Request{Op: OpGPUReset, GPU: "GPU-12345678-1234-1234-1234-123456789abc"}},
		{name: "gpu.reset bad uuid", r: Request{Op: OpGPUReset, GPU: "GPU-../../x"}, wantErr: "gpu must be a GPU-<uuid>"},
		{name: "ping", r: Request{Op: OpPing}},
		{name: "ping with gpu", r: Request{Op: OpPing, GPU: "GPU-12345678-1234-1234-1234-123456789abc"}, wantErr: "ping takes no gpu"},
		{name: "slice.apply", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a1.slice", CPUs: "0-3,8", Mems: "0"}},
		{name: "slice.apply cpus only", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-alloc_01k5w.slice", CPUs: "2"}},
		{name: "slice.apply mems only", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a-b.slice", Mems: "0-1"}},
		{name: "slice.apply neither", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a1.slice"}, wantErr: "no cpus and no mems"},
		{name: "slice.apply no slice", r: Request{Op: OpSliceApply, CPUs: "0"}, wantErr: "is not bcd-alloc-<id>.slice"},
		{name: "slice.apply other slice", r: Request{Op: OpSliceApply, Slice: "system.slice", CPUs: "0"}, wantErr: "is not bcd-alloc-<id>.slice"},
		{name: "slice.apply path in the id", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-../x.slice", CPUs: "0"}, wantErr: "may hold only"},
		{name: "slice.apply id too long", r: Request{Op: OpSliceApply, Slice: SliceName(strings.Repeat("a", 65)), CPUs: "0"}, wantErr: "1 to 64 characters"},
		{name: "slice.apply id of 64", r: Request{Op: OpSliceApply, Slice: SliceName(strings.Repeat("a", 64)), CPUs: "0"}},
		{name: "slice.apply id --", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a--b.slice", CPUs: "0"}, wantErr: "may not start or end"},
		{name: "slice.apply id ending in -", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a-.slice", CPUs: "0"}, wantErr: "may not start or end"},
		{name: "slice.apply bad cpus", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a1.slice", CPUs: "0-3,2"}, wantErr: "cpus: \"2\": items must go up"},
		{name: "slice.apply bad mems", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a1.slice", CPUs: "0", Mems: "0 "}, wantErr: "mems:"},
		{name: "slice.apply with gpu", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a1.slice", CPUs: "0", GPU: "GPU-12345678-1234-1234-1234-123456789abc"}, wantErr: "takes no gpu"},
		{name: "slice.remove", r: Request{Op: OpSliceRemove, Slice: "bcd-alloc-a1.slice"}},
		{name: "slice.remove with cpus", r: Request{Op: OpSliceRemove, Slice: "bcd-alloc-a1.slice", CPUs: "0"}, wantErr: "slice.remove takes no cpus"},
		{name: "slice.remove bad name", r: Request{Op: OpSliceRemove, Slice: "bcd-alloc-x.service"}, wantErr: "is not bcd-alloc-<id>.slice"},
		{name: "slice on file.write", r: Request{Op: OpFileWrite, Kind: "cdi", ID: "a", Slice: "bcd-alloc-a1.slice"}, wantErr: "file.write takes no slice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.r.V = Version
			err := tt.r.Check()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestResponses(t *testing.T) {
	tests := []struct {
		name string
		r    Response
		want string
	}{
		{name: "ok", r: Response{OK: true}, want: `{"v":1,"ok":true}`},
		{name: "failed", r: Response{Error: "not allowed"}, want: `{"v":1,"ok":false,"error":"not allowed","retryable":false}`},
		{name: "busy", r: Response{Error: "busy", Retryable: true}, want: `{"v":1,"ok":false,"error":"busy","retryable":true}`},
		{name: "check", r: Response{OK: true, Rules: ptr(int64(3)), Loaded: ptr(true)}, want: `{"v":1,"ok":true,"rules":3,"loaded":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := EncodeResponse(&tt.r)
			if string(b) != tt.want {
				t.Errorf("EncodeResponse = %s, want %s", b, tt.want)
			}
			got, err := DecodeResponse(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tt.r) {
				t.Errorf("round trip %+v, want %+v", *got, tt.r)
			}
		})
	}
}

func TestDecodeResponseRefuses(t *testing.T) {
	for in, wantErr := range map[string]string{
		`{"v":1,"ok":true,"extra":1}`:                                `unknown field "extra"`,
		`{"v":2,"ok":true}`:                                          "protocol version 2",
		`{"v":1}`:                                                    `no field "ok"`,
		`{"v":1,"ok":true}{"v":1,"ok":true}`:                         "more than one JSON value",
		`{"v":1,"ok":true,"error":"x"}`:                              "ok with an error",
		`{"v":1,"ok":false,"retryable":true}`:                        "failed without an error",
		`{"v":1,"ok":false,"error":"x"}`:                             "failed without an error and retryable",
		`{"v":1,"ok":false,"error":"x","retryable":false,"rules":1}`: "failed with results",
		`{"v":1,"OK":true}`:                                          `unknown field "OK"`,
		`{"v":1,"ok":"true"}`:                                        "wrong type",
		`{"v":1,"ok":true,"pad":"` + strings.Repeat("x", MaxResponse) + `"}`: "larger than",
	} {
		if _, err := DecodeResponse([]byte(in)); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("DecodeResponse(%.60s) = %v, want an error containing %q", in, err, wantErr)
		}
	}
}

func TestCutReason(t *testing.T) {
	if got := CutReason("short"); got != "short" {
		t.Errorf("CutReason(short) = %q", got)
	}
	long := strings.Repeat("a", 199) + "é" + strings.Repeat("b", 50)
	if got := CutReason(long); got != strings.Repeat("a", 199) {
		t.Errorf("CutReason cut inside a rune: %q", got)
	}
	if got := CutReason(strings.Repeat("x", 500)); len(got) != MaxReason {
		t.Errorf("CutReason kept %d bytes", len(got))
	}
}

func TestEncodeRequestChecks(t *testing.T) {
	if _, err := EncodeRequest(&Request{V: 1, Op: OpFileWrite, Kind: "passwd"}); err == nil {
		t.Fatal("EncodeRequest of a kind outside the table succeeded")
	}
	b, err := EncodeRequest(&Request{V: 1, Op: OpFileWrite, Kind: "cdi", ID: "a", Data: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"v":1,"op":"file.write","kind":"cdi","id":"a","data":"e30="}` {
		t.Errorf("EncodeRequest = %s", b)
	}
}

// FuzzDecodeRequest: the decoder never panics, and what it accepts is
// version 1, re-encodes, and decodes again to the same request.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"op":"file.write","kind":"cdi","id":"x","data":"aGk="}`,
		`{"v":1,"op":"firewall.check","rules":3}`,
		`{"v":1,"op":"firewall.apply","ruleset":"table inet bcd_taps {\n}\n"}`,
		`{"v":1,"op":"reboot","reason":"é"}`,
		`{"v":1,"op":"x","op":"y"}`,
		`{"v":2}`,
		`[1]`,
		`{"v":1,"op":"gpu.reset","gpu":"GPU-12345678-1234-1234-1234-123456789abc"} `,
		`{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"0-3,8","mems":"0"}`,
		`{"v":1,"op":"slice.remove","slice":"bcd-alloc-a1.slice"}`,
		`{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"1-0"}`,
		`{"v":1,"op":"ping"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRequest(data)
		if err != nil {
			return
		}
		if r.V != Version {
			t.Fatalf("accepted version %d", r.V)
		}
		if len(data) > MaxRequest {
			t.Fatalf("accepted %d bytes", len(data))
		}
		b, err := jsonOf(r)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeRequest(b)
		if err != nil {
			t.Fatalf("re-encoded request %s does not decode: %v", b, err)
		}
		if !reflect.DeepEqual(normal(r), normal(again)) {
			t.Fatalf("round trip %+v != %+v", r, again)
		}
		_ = r.Check() // must not panic
	})
}

func ptr[T any](v T) *T { return &v }
