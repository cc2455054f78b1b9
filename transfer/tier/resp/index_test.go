package resp

import (
	"fmt"
	"testing"
	"time"
)

func TestIndexLRUAndTTL(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	x := newIndex(100, 10*time.Second)
	for i := range 4 {
		if v, err := x.reserve(fmt.Sprint(i), 25, t0.Add(time.Duration(i)*time.Second)); err != nil || len(v) != 0 {
			t.Fatalf("reserve %d: %v %v", i, v, err)
		}
	}
	x.touch("0")
	// Full: the least recently used (1) goes; key 2 too for a value of 50.
	v, err := x.reserve("4", 50, t0.Add(5*time.Second))
	if err != nil || fmt.Sprint(v) != "[1 2]" {
		t.Fatalf("victims %v, %v; want [1 2]", v, err)
	}
	// Rewriting a key replaces its size instead of counting it twice.
	if v, _ := x.reserve("4", 50, t0.Add(5*time.Second)); len(v) != 0 {
		t.Fatalf("rewrite evicted %v", v)
	}
	if used, n := x.usage(t0.Add(5 * time.Second)); used != 100 || n != 3 {
		t.Fatalf("usage %d/%d", used, n)
	}
	// Past the TTL of keys 0 (written at +0s) and 3 (+3s): the server
	// expired them; they leave the count without a DEL.
	if used, n := x.usage(t0.Add(14 * time.Second)); used != 50 || n != 1 {
		t.Fatalf("usage after TTL %d/%d; want 50/1", used, n)
	}
	if _, err := x.reserve("big", 101, t0); err == nil {
		t.Fatal("a value over the capacity was reserved")
	}
	x.remove("4")
	x.remove("absent")
	if used, n := x.usage(t0.Add(20 * time.Second)); used != 0 || n != 0 {
		t.Fatalf("usage after remove %d/%d", used, n)
	}
}

func TestIndexEntryBound(t *testing.T) {
	x := newIndex(1<<40, 0)
	evicted := 0
	for i := range maxIndexEntries + 10 {
		v, err := x.reserve(fmt.Sprint(i), 1, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		evicted += len(v)
	}
	if _, n := x.usage(time.Time{}); n != maxIndexEntries || evicted != 10 {
		t.Fatalf("%d entries, %d evicted; want %d, 10", n, evicted, maxIndexEntries)
	}
}

// TestIndexTellsContents: a key is told held once its write is confirmed
// (not when reserved, not when an eviction overtook the write), and told
// gone when it leaves the index for room, by its TTL, a remove or a clear;
// a rewrite of a held key tells nothing, and an adopted key (an earlier
// run's) is never told.
func TestIndexTellsContents(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	x := newIndex(100, 10*time.Second)
	var got []string
	f := func(k string, present bool) { got = append(got, fmt.Sprint(k, present)) }
	x.tell.Store(&f)
	take := func(want ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("told %v, want %v", got, want)
		}
		got = nil
	}
	x.reserve("a", 40, t0)
	take()
	x.confirm("a")
	x.confirm("a") // once
	take("atrue")
	x.reserve("a", 40, t0) // a rewrite: held still
	x.confirm("a")
	take()
	x.reserve("b", 40, t0)
	x.reserve("c", 40, t0.Add(time.Second)) // evicts a (held) for room
	take("afalse")
	x.remove("b") // never confirmed: nothing
	x.confirm("b")
	take()
	x.confirm("c")
	x.adopt([]entry{{key: "old", size: 10, written: t0}}, t0)
	take("ctrue")
	x.usage(t0.Add(11 * time.Second)) // past c's TTL (and old's)
	take("cfalse")
	x.reserve("d", 10, t0.Add(12*time.Second))
	x.confirm("d")
	x.takeAll()
	take("dtrue", "dfalse")
}
