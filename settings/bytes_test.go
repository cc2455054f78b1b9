package settings

import "testing"

func TestBytesText(t *testing.T) {
	for n, want := range map[int64]string{
		-1:                 "n/a",
		0:                  "0 B",
		1023:               "1023 B",
		1024:               "1.0 KiB",
		3 << 20:            "3.0 MiB",
		512 << 20:          "512 MiB",
		1536 << 20:         "1.5 GiB",
		141 << 30:          "141 GiB",
		1 << 60:            "1.0 EiB",
		(1 << 63) - 1:      "8.0 EiB",
		99*(1<<30) + 1<<29: "99.5 GiB",
	} {
		if got := BytesText(n); got != want {
			t.Errorf("BytesText(%d) = %q, want %q", n, got, want)
		}
	}
}
