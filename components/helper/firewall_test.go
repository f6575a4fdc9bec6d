package helper

import "testing"

func TestCountRules(t *testing.T) {
	out := `{"nftables": [{"metainfo": {"version": "1.0.9"}}, {"table": {"family": "inet", "name": "bcd_taps"}},
{"chain": {"name": "input"}}, {"rule": {"chain": "input"}}, {"rule": {"chain": "input"}}, {"set": {"name": "s"}}]}`
	n, err := countRules([]byte(out))
	if err != nil || n != 2 {
		t.Fatalf("countRules = %d, %v; want 2", n, err)
	}
	if _, err := countRules([]byte("table inet bcd_taps {")); err == nil {
		t.Fatal("countRules of text succeeded")
	}
}
