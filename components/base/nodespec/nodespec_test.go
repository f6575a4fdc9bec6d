package nodespec

import (
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	for _, tt := range []struct {
		in, wantErr string
		sections    int
	}{
		{`{}`, "", 0},
		{`{"devices":{"holds":[]},"site":null}`, "", 1},
		{`{"fakehw":{"files":{"a":"b"}},"host":{}}`, "", 2},
		{`{"gpus":{}}`, `unknown section "gpus"`, 0},
		{`[]`, "not a JSON object", 0},
		{`"x"`, "not a JSON object", 0},
		{`{"host":{}} {"x":1}`, "data after", 0},
		{`{"host":`, "not a JSON object", 0},
		{``, "not a JSON object", 0},
		{`{"host":{}}` + strings.Repeat(" ", MaxBytes), "at most", 0},
	} {
		s, err := Decode([]byte(tt.in))
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("Decode(%.40q) = %v", tt.in, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("Decode(%.40q) = %v, want %q", tt.in, err, tt.wantErr)
		case err == nil && len(s) != tt.sections:
			t.Errorf("Decode(%.40q) has %d sections, want %d", tt.in, len(s), tt.sections)
		}
	}
}

func TestEncodeInOrder(t *testing.T) {
	s, err := Decode([]byte(`{"site": {"a": 1}, "host": { "b" : [1, 2] }, "devices":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(s.Encode()); got != `{"host":{"b":[1,2]},"devices":{},"site":{"a":1}}` {
		t.Errorf("Encode = %s", got)
	}
}

func TestMerge(t *testing.T) {
	held := []byte(`{"fakehw":{"files":{"a":"1","b":"2"}},"site":{"cache_images":[]}}`)
	for _, tt := range []struct {
		patch, want, wantErr string
	}{
		{`{"fakehw":{"files":{"b":"3","c":"4"}}}`, `{"site":{"cache_images":[]},"fakehw":{"files":{"a":"1","b":"3","c":"4"}}}`, ""},
		{`{"fakehw":{"files":{"a":null}}}`, `{"site":{"cache_images":[]},"fakehw":{"files":{"b":"2"}}}`, ""},
		{`{"site":null}`, `{"fakehw":{"files":{"a":"1","b":"2"}}}`, ""},
		{`{"nope":{}}`, "", `unknown section "nope"`},
		{`[1]`, "", "not a JSON object"},
		{`null`, "", "not a JSON object"},
		{`{"fakehw":`, "", "not a JSON object"},
	} {
		s, err := Merge(held, []byte(tt.patch))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Merge(%s) = %v, want %q", tt.patch, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("Merge(%s) = %v", tt.patch, err)
			continue
		}
		if got := string(s.Encode()); got != tt.want {
			t.Errorf("Merge(%s) = %s, want %s", tt.patch, got, tt.want)
		}
	}
	if _, err := Merge(nil, []byte(`{"host":{"x":1}}`)); err != nil {
		t.Errorf("a patch onto no spec: %v", err)
	}
}

// FuzzDecode: Decode never panics, and what it accepts encodes to a spec
// it accepts again, with the same sections.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{}`, `{"host":{"a":1},"site":null}`, `{"gpus":1}`, `[]`, `{"devices":{"holds":[{"allocation":"a"}]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err != nil {
			return
		}
		again, err := Decode(s.Encode())
		if err != nil || len(again) != len(s) {
			t.Fatalf("Decode(Encode(%q)) = %v, %v", b, again, err)
		}
	})
}

// FuzzMerge: Merge never panics, and what it returns is a spec Decode
// accepts.
func FuzzMerge(f *testing.F) {
	f.Add([]byte(`{"fakehw":{"files":{"a":"1"}}}`), []byte(`{"fakehw":{"files":{"a":null,"b":"2"}}}`))
	f.Add([]byte(`{}`), []byte(`{"site":{"boot_lease":{"held":true}}}`))
	f.Add([]byte(`{"host":1}`), []byte(`{"host":null}`))
	f.Fuzz(func(t *testing.T, held, patch []byte) {
		s, err := Merge(held, patch)
		if err != nil {
			return
		}
		if _, err := Decode(s.Encode()); err != nil {
			t.Fatalf("Merge(%q, %q) gave %s, which Decode refuses: %v", held, patch, s.Encode(), err)
		}
	})
}
