package settings

import "testing"

func TestDialAddr(t *testing.T) {
	for host, want := range map[string]string{
		"":            "127.0.0.1:5555",
		"0.0.0.0":     "127.0.0.1:5555",
		"localhost":   "127.0.0.1:5555",
		"::":          "[::1]:5555",
		"[::]":        "[::1]:5555",
		"[fe80::1]":   "[fe80::1]:5555",
		"10.0.0.7":    "10.0.0.7:5555",
		"cache.local": "cache.local:5555",
	} {
		if got := DialAddr(host, 5555); got != want {
			t.Errorf("DialAddr(%q) = %q, want %q", host, got, want)
		}
	}
}
