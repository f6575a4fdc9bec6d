package strictjson

import (
	"errors"
	"testing"
)

func TestDecode(t *testing.T) {
	type T struct {
		A int `json:"a"`
	}
	for _, tt := range []struct {
		in  string
		ok  bool
		tra bool
	}{
		{`{"a":1}`, true, false},
		{` {"a":1} `, true, false},
		{`{"a":1,"b":2}`, false, false},
		{`{"a":1}{"a":2}`, false, true},
		{`{"a":1} x`, false, true},
		{`{"a":"x"}`, false, false},
		{``, false, false},
	} {
		var v T
		err := Decode([]byte(tt.in), &v)
		if (err == nil) != tt.ok || errors.Is(err, ErrTrailing) != tt.tra {
			t.Errorf("Decode(%q) = %v", tt.in, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"a":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var v struct {
			A []int `json:"a"`
		}
		_ = Decode(b, &v)
	})
}
