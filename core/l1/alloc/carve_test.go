package alloc

import (
	"strings"
	"testing"
)

func TestCarveRebuildsFreeSpace(t *testing.T) {
	a, _ := New(64<<10, 4096)
	used := []Extent{{Off: 8192, Size: 100}, {Off: 0, Size: 4096}, {Off: 32768, Size: 8000}}
	if err := a.Carve(used); err != nil {
		t.Fatal(err)
	}
	if want := int64(64<<10 - 4096 - 4096 - 8192); a.Free() != want {
		t.Fatalf("free %d, want %d", a.Free(), want)
	}
	// The carved extents are never handed out again.
	got := map[int64]bool{}
	for {
		off, ok := a.Alloc(4096)
		if !ok {
			break
		}
		got[off] = true
	}
	for _, off := range []int64{0, 8192, 32768, 36864} {
		if got[off] {
			t.Fatalf("offset %d allocated although carved", off)
		}
	}
	if len(got) != 16-4 {
		t.Fatalf("%d free units, want 12", len(got))
	}
	a.Release(8192, 100)
	if off, ok := a.Alloc(4096); !ok || off != 8192 {
		t.Fatalf("released carved extent not reused: %d %v", off, ok)
	}
}

func TestCarveRefusesBadExtents(t *testing.T) {
	for name, tc := range map[string]struct {
		used []Extent
		want string
	}{
		"overlap":    {[]Extent{{0, 8192}, {4096, 10}}, "overlaps"},
		"unaligned":  {[]Extent{{100, 10}}, "not aligned"},
		"outside":    {[]Extent{{60 << 10, 8192}}, "passes the region"},
		"negative":   {[]Extent{{-4096, 10}}, "not aligned"},
		"empty":      {[]Extent{{0, 0}}, "want > 0"},
		"huge":       {[]Extent{{4096, 1 << 62}}, "passes the region"},
		"same start": {[]Extent{{4096, 10}, {4096, 10}}, "overlaps"},
	} {
		a, _ := New(64<<10, 4096)
		err := a.Carve(tc.used)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", name, err, tc.want)
		}
		if a.Free() != 64<<10 {
			t.Errorf("%s: a refused carve changed the allocator (free %d)", name, a.Free())
		}
	}
}
