package wire

import (
	"bytes"
	"encoding/json"
	"github.com/better-compute/bcd/components/trust/release"
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
		{name: "tpm.sign", in: `{"v":1,"op":"tpm.sign","unique":"` + b64(32, 1) + `","digest":"` + b64(48, 2) + `"}`,
			want: &Request{V: 1, Op: "tpm.sign", Unique: fill(32, 1), Digest: fill(48, 2)}},
		{name: "tpm.certify", in: `{"v":1,"op":"tpm.certify","unique":"` + b64(32, 1) + `","qualifying_data":"` + b64(32, 3) + `"}`,
			want: &Request{V: 1, Op: "tpm.certify", Unique: fill(32, 1), QualifyingData: fill(32, 3)}},
		{name: "unique as a number", in: `{"v":1,"op":"tpm.nodekey","unique":12}`, wantErr: `field "unique" has the wrong type`},
		{name: "qualifying data in another case", in: `{"v":1,"op":"tpm.certify","qualifyingData":"AA=="}`, wantErr: `unknown field "qualifyingData"`},
		{name: "unique not base64", in: `{"v":1,"op":"tpm.nodekey","unique":"not base64!"}`, wantErr: "request"},
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
		{name: "file.remove", r: Request{Op: OpFileRemove, Kind: "k8s-token"}},
		{name: "unknown op", r: Request{Op: "file.chmod"}, wantErr: `unknown operation "file.chmod"`},
		{name: "file kind unknown", r: Request{Op: OpFileWrite, Kind: "passwd"}, wantErr: "not in bcd helper's file table"},
		{name: "file id outside", r: Request{Op: OpFileWrite, Kind: "cdi", ID: "../x"}, wantErr: "not in bcd helper's file table"},
		{name: "file too large", r: Request{Op: OpFileWrite, Kind: "cdi", ID: "a", Data: big}, wantErr: "more than 1048576"},
		{name: "remove with data", r: Request{Op: OpFileRemove, Kind: "cdi", ID: "a", Data: []byte("x")}, wantErr: "file.remove takes no data"},
		{name: "write with a proof", r: Request{Op: OpFileWrite, Kind: "cdi", ID: "a", Proof: json.RawMessage(`{}`)}, wantErr: "takes no proof"},
		{name: "firewall.apply is gone", r: Request{Op: "firewall.apply"}, wantErr: "unknown operation"},
		{name: "access without a proof", r: Request{Op: OpAccessApply, Section: []byte(`{}`)}, wantErr: "no proof"},
		{name: "access with a bad proof", r: Request{Op: OpAccessApply, Proof: json.RawMessage(`{"node_id":"n"}`)}, wantErr: "no node id or generation"},
		{name: "access section too large", r: Request{Op: OpAccessApply, Proof: json.RawMessage(proofJSON), Section: make([]byte, MaxSection+1)}, wantErr: "more than"},
		{name: "access", r: Request{Op: OpAccessApply, Proof: json.RawMessage(proofJSON), Section: []byte(`{}`)}},
		{name: "check", r: Request{Op: OpFirewallCheck, Rules: ptr(int64(0))}},
		{name: "update.swap", r: Request{Op: OpUpdateSwap, Document: []byte("{}")}},
		{name: "update.prepare of MaxDocument", r: Request{Op: OpUpdatePrepare, Document: bytes.Repeat([]byte("x"), MaxDocument)}},
		{name: "update.prepare too large", r: Request{Op: OpUpdatePrepare, Document: bytes.Repeat([]byte("x"), MaxDocument+1)}, wantErr: "more than 65536"},
		{name: "update.swap no document", r: Request{Op: OpUpdateSwap}, wantErr: "update.swap: no document"},
		{name: "update.confirm with a document", r: Request{Op: OpUpdateConfirm, Document: []byte("x")}, wantErr: "update.confirm takes no document"},
		{name: "update.swap with an id", r: Request{Op: OpUpdateSwap, Document: []byte("x"), ID: "/tmp/x"}, wantErr: "update.swap takes no id"},
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
		{name: "slice.apply neither", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a1.slice"}, wantErr: "no cpus, no mems and no memory_max"},
		{name: "slice.apply memory only", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a1.slice", MemoryMax: 1 << 30}},
		{name: "slice.apply memory too small", r: Request{Op: OpSliceApply, Slice: "bcd-alloc-a1.slice", MemoryMax: 4096}, wantErr: "below"},
		{name: "slice.remove with memory", r: Request{Op: OpSliceRemove, Slice: "bcd-alloc-a1.slice", MemoryMax: 1 << 30}, wantErr: "slice.remove takes no memory_max"},
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
		{name: "tpm.nodekey", r: Request{Op: OpTPMNodeKey, Unique: fill(32, 1)}},
		{name: "tpm.nodekey no unique", r: Request{Op: OpTPMNodeKey}, wantErr: "tpm.nodekey: unique is 0 bytes, want 32"},
		{name: "tpm.nodekey short unique", r: Request{Op: OpTPMNodeKey, Unique: fill(31, 1)}, wantErr: "unique is 31 bytes, want 32"},
		{name: "tpm.nodekey long unique", r: Request{Op: OpTPMNodeKey, Unique: fill(33, 1)}, wantErr: "unique is 33 bytes, want 32"},
		{name: "tpm.nodekey with digest", r: Request{Op: OpTPMNodeKey, Unique: fill(32, 1), Digest: fill(32, 2)}, wantErr: "tpm.nodekey takes no digest"},
		{name: "tpm.sign sha256", r: Request{Op: OpTPMSign, Unique: fill(32, 1), Digest: fill(32, 2)}},
		{name: "tpm.sign sha384", r: Request{Op: OpTPMSign, Unique: fill(32, 1), Digest: fill(48, 2)}},
		{name: "tpm.sign sha512", r: Request{Op: OpTPMSign, Unique: fill(32, 1), Digest: fill(64, 2)}},
		{name: "tpm.sign no digest", r: Request{Op: OpTPMSign, Unique: fill(32, 1)}, wantErr: "digest is 0 bytes, want 32, 48 or 64"},
		{name: "tpm.sign 20-byte digest", r: Request{Op: OpTPMSign, Unique: fill(32, 1), Digest: fill(20, 2)}, wantErr: "digest is 20 bytes"},
		{name: "tpm.sign 33-byte digest", r: Request{Op: OpTPMSign, Unique: fill(32, 1), Digest: fill(33, 2)}, wantErr: "digest is 33 bytes"},
		{name: "tpm.sign no unique", r: Request{Op: OpTPMSign, Digest: fill(32, 2)}, wantErr: "unique is 0 bytes"},
		{name: "tpm.sign with qualifying data", r: Request{Op: OpTPMSign, Unique: fill(32, 1), Digest: fill(32, 2), QualifyingData: fill(32, 3)}, wantErr: "tpm.sign takes no qualifying_data"},
		{name: "tpm.ak", r: Request{Op: OpTPMAK}},
		{name: "tpm.ak with unique", r: Request{Op: OpTPMAK, Unique: fill(32, 1)}, wantErr: "tpm.ak takes no unique"},
		{name: "tpm.certify", r: Request{Op: OpTPMCertify, Unique: fill(32, 1), QualifyingData: fill(32, 3)}},
		{name: "tpm.certify short qualifying data", r: Request{Op: OpTPMCertify, Unique: fill(32, 1), QualifyingData: fill(31, 3)}, wantErr: "qualifying_data is 31 bytes, want 32"},
		{name: "tpm.certify sha512 qualifying data", r: Request{Op: OpTPMCertify, Unique: fill(32, 1), QualifyingData: fill(64, 3)}, wantErr: "qualifying_data is 64 bytes, want 32"},
		{name: "tpm.certify with digest", r: Request{Op: OpTPMCertify, Unique: fill(32, 1), QualifyingData: fill(32, 3), Digest: fill(32, 2)}, wantErr: "tpm.certify takes no digest"},
		{name: "tpm.release", r: Request{Op: OpTPMRelease, Unique: fill(32, 1)}},
		{name: "tpm.release short unique", r: Request{Op: OpTPMRelease, Unique: fill(16, 1)}, wantErr: "unique is 16 bytes"},
		{name: "tpm.quote", r: Request{Op: "tpm.quote"}, wantErr: `unknown operation "tpm.quote"`},
		{name: "unique on file.write", r: Request{Op: OpFileWrite, Kind: "cdi", ID: "a", Unique: fill(32, 1)}, wantErr: "file.write takes no unique"},
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
		{name: "tpm.certify", r: Response{OK: true, Attest: []byte{1}, Signature: []byte{2}, AKPublic: []byte{3}},
			want: `{"v":1,"ok":true,"signature":"Ag==","attest":"AQ==","ak_public":"Aw=="}`},
		{name: "tpm.nodekey", r: Response{OK: true, Public: []byte{0xff}}, want: `{"v":1,"ok":true,"public":"/w=="}`},
		{name: "final", r: Response{Error: "release manifest refused: x", Final: true}, want: `{"v":1,"ok":false,"error":"release manifest refused: x","retryable":false,"final":true}`},
		{name: "update", r: Response{OK: true, Update: []byte(`{"confirmed":true}`)}, want: `{"v":1,"ok":true,"update":{"confirmed":true}}`},
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
		`{"v":1,"ok":true,"extra":1}`:                                        `unknown field "extra"`,
		`{"v":2,"ok":true}`:                                                  "protocol version 2",
		`{"v":1}`:                                                            `no field "ok"`,
		`{"v":1,"ok":true}{"v":1,"ok":true}`:                                 "more than one JSON value",
		`{"v":1,"ok":true,"error":"x"}`:                                      "ok with an error",
		`{"v":1,"ok":false,"retryable":true}`:                                "failed without an error",
		`{"v":1,"ok":false,"error":"x"}`:                                     "failed without an error and retryable",
		`{"v":1,"ok":false,"error":"x","retryable":false,"rules":1}`:         "failed with results",
		`{"v":1,"ok":false,"error":"x","retryable":false,"public":"AA=="}`:   "failed with results",
		`{"v":1,"ok":true,"signature":"!"}`:                                  "helper answer",
		`{"v":1,"ok":true,"final":true}`:                                     "ok with an error",
		`{"v":1,"ok":false,"error":"x","retryable":true,"final":true}`:       "final and retryable",
		`{"v":1,"ok":false,"error":"x","retryable":false,"update":{}}`:       "failed with results",
		`{"v":1,"ok":true,"update":[1]}`:                                     `field "update" has the wrong type`,
		`{"v":1,"ok":true,"public":null}`:                                    `field "public" has the wrong type`,
		`{"v":1,"OK":true}`:                                                  `unknown field "OK"`,
		`{"v":1,"ok":"true"}`:                                                "wrong type",
		`{"v":1,"ok":true,"pad":"` + strings.Repeat("x", MaxResponse) + `"}`: "larger than",
	} {
		if _, err := DecodeResponse([]byte(in)); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("DecodeResponse(%.60s) = %v, want an error containing %q", in, err, wantErr)
		}
	}
}

func TestCheckAnswer(t *testing.T) {
	b := []byte{1}
	tests := []struct {
		op      string
		r       Response
		wantErr string
	}{
		{op: OpPing, r: Response{OK: true}},
		{op: OpPing, r: Response{OK: true, Public: b}, wantErr: "answer to ping carries public"},
		{op: OpFirewallCheck, r: Response{OK: true, Rules: ptr(int64(1)), Loaded: ptr(false)}},
		{op: OpFirewallCheck, r: Response{OK: true, Rules: ptr(int64(1))}, wantErr: "carries no loaded"},
		{op: OpTPMNodeKey, r: Response{OK: true, Public: b}},
		{op: OpTPMNodeKey, r: Response{OK: true}, wantErr: "answer to tpm.nodekey carries no public"},
		{op: OpTPMNodeKey, r: Response{OK: true, Public: b, AKPublic: b}, wantErr: "carries ak_public"},
		{op: OpTPMSign, r: Response{OK: true, Signature: b}},
		{op: OpTPMSign, r: Response{OK: true, Signature: b, Attest: b}, wantErr: "tpm.sign carries attest"},
		{op: OpTPMAK, r: Response{OK: true, AKPublic: b}},
		{op: OpTPMAK, r: Response{OK: true, Public: b}, wantErr: "carries public"},
		{op: OpTPMCertify, r: Response{OK: true, Attest: b, Signature: b, AKPublic: b}},
		{op: OpTPMCertify, r: Response{OK: true, Attest: b, Signature: b}, wantErr: "carries no ak_public"},
		{op: OpTPMRelease, r: Response{OK: true}},
		{op: OpTPMRelease, r: Response{OK: true, Signature: b}, wantErr: "tpm.release carries signature"},
		{op: OpTPMSign, r: Response{Error: "refused"}}, // a failure carries nothing: DecodeResponse checks it
	}
	for _, tt := range tests {
		err := tt.r.CheckAnswer(tt.op)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("CheckAnswer(%s, %+v) = %v, want %q", tt.op, tt.r, err, tt.wantErr)
		}
	}
}

// FuzzDecodeResponse: the node's decoder of the helper's answers never
// panics, and what it accepts re-encodes and decodes to the same answer.
func FuzzDecodeResponse(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"ok":true}`,
		`{"v":1,"ok":false,"error":"busy","retryable":true}`,
		`{"v":1,"ok":true,"rules":3,"loaded":true}`,
		`{"v":1,"ok":true,"public":"AAEC"}`,
		`{"v":1,"ok":true,"signature":"MEUCIQ==","attest":"/1RDRw==","ak_public":"ACM="}`,
		`{"v":1,"ok":false,"error":"x","retryable":false,"signature":"AA=="}`,
		`{"v":1,"ok":true,"public":"A"}`,
		`{"v":1,"ok":true,"console":true}`,
		`{"v":1,"ok":false,"error":"x","retryable":false,"console":true}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeResponse(data)
		if err != nil {
			return
		}
		again, err := DecodeResponse(EncodeResponse(r))
		if err != nil {
			t.Fatalf("re-encoded answer %s does not decode: %v", EncodeResponse(r), err)
		}
		if !reflect.DeepEqual(normalResponse(r), normalResponse(again)) {
			t.Fatalf("round trip %+v != %+v", r, again)
		}
		_ = r.CheckAnswer(OpTPMCertify) // must not panic
	})
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
// proofJSON is a well-formed (unsigned) proof.
const proofJSON = `{"node_id":"node_a","generation":1,"patch":false,"base_generation":0,"spec_sha256":"` +
	`AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","sections":{},"signature":null}`

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
		`{"v":1,"op":"access.apply","section":"e30=","proof":` + proofJSON + `}`,
		`{"v":1,"op":"tpm.nodekey","unique":"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="}`,
		`{"v":1,"op":"tpm.sign","unique":"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=","digest":"AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI="}`,
		`{"v":1,"op":"tpm.ak"}`,
		`{"v":1,"op":"tpm.certify","unique":"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=","qualifying_data":"AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM="}`,
		`{"v":1,"op":"tpm.release","unique":"AQEB"}`,
		`{"v":1,"op":"tpm.sign","unique":"AQ\nEB","digest":""}`,
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

// The wire's bound on a manifest document is the release package's.
func TestMaxDocumentIsRelease(t *testing.T) {
	if MaxDocument != release.MaxDocument {
		t.Errorf("wire.MaxDocument %d, release.MaxDocument %d", MaxDocument, release.MaxDocument)
	}
}
