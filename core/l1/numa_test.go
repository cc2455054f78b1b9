package l1

import (
	"testing"
	"time"
)

// The pool finds its own mapping in /proc/self/numa_maps: untouched pages
// are on no node, written ones are, and a reading is reused for 30 s.
func TestPlacementOfThePool(t *testing.T) {
	p, c := newPool(t, 16, nil)
	pl, err := p.Placement()
	if err != "" || pl.Resident() != 0 {
		t.Fatalf("fresh pool: %+v, %q", pl, err)
	}
	mem, release := p.View(0, 16*4096)
	for i := range mem {
		mem[i] = 1
	}
	release()
	if pl, _ = p.Placement(); pl.Resident() != 0 {
		t.Fatal("a reading younger than 30 s was not reused")
	}
	c.Advance(31 * time.Second)
	pl, err = p.Placement()
	if err != "" || pl.Resident() != 16 || pl.PageSize != 4096 {
		t.Fatalf("written pool: %+v, %q; want 16 pages of 4 KiB", pl, err)
	}
	p.Close()
	c.Advance(31 * time.Second)
	if _, err = p.Placement(); err != "pool closed" {
		t.Fatalf("closed pool: %q", err)
	}
}
