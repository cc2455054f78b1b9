package layout

import (
	"strings"
	"testing"
)

func TestNewShapesAndBytes(t *testing.T) {
	l, err := New(32, 256, 1024, "bfloat16", false)
	if err != nil {
		t.Fatal(err)
	}
	if l.String() != "[2 32 256 1024] bfloat16" || l.Bytes != 32<<20 {
		t.Fatalf("llama-3.1-8b chunk: %s, %d bytes", l, l.Bytes)
	}
	m, err := New(2, 16, 16, "float32", true)
	if err != nil {
		t.Fatal(err)
	}
	if m.String() != "[2 16 16] float32" || m.Bytes != 2*16*16*4 {
		t.Fatalf("MLA chunk: %s, %d bytes", m, m.Bytes)
	}
	if l.Equal(m) || !m.Equal(m) {
		t.Fatal("Equal")
	}
}

func TestNewRejectsEveryBadFigureAtOnce(t *testing.T) {
	_, err := New(0, -1, 0, "float7", false)
	if err == nil {
		t.Fatal("accepted a bad layout")
	}
	for _, want := range []string{"num_layers = 0", "chunk size = -1", "hidden_dim_size = 0", `dtype_str = "float7"`, "bfloat16"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := New(1<<20, 1<<20, 1<<20, "float64", false); err == nil || !strings.Contains(err.Error(), "1 GiB") {
		t.Fatalf("huge layout: %v", err)
	}
	long := strings.Repeat("x", 1<<20)
	if _, err := New(1, 1, 1, long, false); err == nil || len(err.Error()) > 1024 || !strings.Contains(err.Error(), "1048576 bytes") {
		t.Fatalf("a 1 MiB dtype_str must give a short error, got %d bytes", len(err.Error()))
	}
}

// A product that wraps 64 bits (2^30 layers × 2^24 hidden gave chunk bytes
// 0) or passes MaxChunkBytes is refused with an error naming the fields.
func TestNewRefusesOverflowAndHugeChunks(t *testing.T) {
	cases := []struct {
		layers, chunk, hidden int
		dtype                 string
		mla                   bool
	}{
		{1 << 30, 256, 1 << 24, "bfloat16", false},
		{1 << 30, 256, 1 << 24, "bfloat16", true},
		{1<<31 - 1, 1<<31 - 1, 1<<31 - 1, "float64", false},
		{1 << 30, 1, 1 << 30, "bool", true},
		{1 << 20, 1 << 20, 1 << 20, "float64", false},
		{2, 256, 1<<19 + 1, "float16", false}, // 1 GiB + 2 KiB
		{32, 256, 16385, "float32", false},    // 1 GiB + 64 KiB
	}
	for _, c := range cases {
		l, err := New(c.layers, c.chunk, c.hidden, c.dtype, c.mla)
		if err == nil {
			t.Errorf("New(%d, %d, %d, %s, %v) accepted: %s, %d bytes", c.layers, c.chunk, c.hidden, c.dtype, c.mla, l, l.Bytes)
			continue
		}
		for _, want := range []string{"num_layers", "hidden_dim_size", "chunk size", "1 GiB"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %q", err, want)
			}
		}
	}
	// The largest accepted chunk is exactly MaxChunkBytes (1 GiB).
	l, err := New(2, 256, 1<<19, "float16", false)
	if err != nil || l.Bytes != 1<<30 {
		t.Fatalf("1 GiB chunk: %v, %d bytes", err, l.Bytes)
	}
}

func TestDtypes(t *testing.T) {
	for name, size := range map[string]int{"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3fn": 1,
		"float8_e5m2": 1, "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1} {
		if got, ok := DtypeSize(name); !ok || got != size {
			t.Errorf("DtypeSize(%s) = %d, %v", name, got, ok)
		}
	}
	if _, ok := DtypeSize("complex64"); ok {
		t.Error("complex64 accepted")
	}
	if len(DtypeNames()) != 12 {
		t.Errorf("DtypeNames: %v", DtypeNames())
	}
}

func TestRegistryRefCounts(t *testing.T) {
	r := NewRegistry()
	l, _ := New(2, 16, 16, "float16", false)
	r.Add("m", 2, l)
	r.Add("m", 2, l)
	if !r.Has("m", 2) || r.Has("m", 1) || r.Has("n", 2) {
		t.Fatal("Has")
	}
	r.Remove("m", 2, ID([]Layout{l}))
	if got, ok := r.Get("m", 2); !ok || !got.Equal(l) {
		t.Fatal("entry dropped while referenced")
	}
	r.Remove("m", 2, ID([]Layout{l}))
	if r.Has("m", 2) {
		t.Fatal("entry kept after the last reference")
	}
	r.Add("x", 1, l)
	r.Clear()
	if r.Has("x", 1) {
		t.Fatal("Clear")
	}
}
