package misses

import (
	"testing"

	"kvdock/core/keys"
	"kvdock/core/testkit/chunks"
)

// fakePool answers from sets of readable keys and of keys stored under
// another world size.
type fakePool struct {
	readable, elsewhere map[keys.ObjectKey]bool
	asked               int // keys Unreadable was asked about
}

func (f *fakePool) Unreadable(ks []keys.ObjectKey) uint64 {
	var m uint64
	for j := range ks[:min(len(ks), 64)] {
		f.asked++
		if !f.readable[ks[j]] {
			m |= 1 << j
		}
	}
	return m
}

func (f *fakePool) StoredElsewhere(k *keys.ObjectKey) bool { return f.elsewhere[*k] }

func ck(i int) keys.ObjectKey { return chunks.Key(i) }

func cks(from, to int) []keys.ObjectKey { return chunks.Keys(from, to) }

func TestClassifierReasons(t *testing.T) {
	f := &fakePool{readable: map[keys.ObjectKey]bool{ck(0): true, ck(1): true}, elsewhere: map[keys.ObjectKey]bool{ck(3): true}}
	g := NewGhost(64)
	g.Note(g.DigestKey(new(ck(2))), Evicted)
	cl := NewClassifier(f, g)
	var c Counts
	cl.ClassifyMisses(cks(0, 5), 1, AfterMiss, &c)
	want := Counts{AfterMiss: 2, Evicted: 1, OtherLayout: 1, NeverStored: 1}
	if c != want {
		t.Fatalf("counts %v, want %v", c, want)
	}
	// The lookup's own reason for the readable chunks.
	c = Counts{}
	cl.ClassifyMisses(cks(0, 2), 1, Refused, &c)
	if c != (Counts{Refused: 2}) {
		t.Fatalf("refused lookup: %v", c)
	}
}

// A chunk of several keys is judged by its first unreadable key, chunks
// straddle the 64-key windows, and a trailing partial chunk or a zero per
// is ignored.
func TestClassifierChunks(t *testing.T) {
	ks := cks(0, 70) // 23 chunks of 3 keys and one key over
	f := &fakePool{readable: map[keys.ObjectKey]bool{}, elsewhere: map[keys.ObjectKey]bool{}}
	for _, k := range ks {
		f.readable[k] = true
	}
	g := NewGhost(64)
	// Chunk 0: key 1 cleared, key 2 evicted: judged by key 1.
	delete(f.readable, ks[1])
	delete(f.readable, ks[2])
	g.Note(g.DigestKey(&ks[1]), Cleared)
	g.Note(g.DigestKey(&ks[2]), Evicted)
	// Chunk 21 (keys 63..65) straddles the window: key 63 readable, 64
	// expired, 65 never stored.
	delete(f.readable, ks[64])
	delete(f.readable, ks[65])
	g.Note(g.DigestKey(&ks[64]), Expired)
	// The key over (69) is not a chunk.
	delete(f.readable, ks[69])
	var c Counts
	NewClassifier(f, g).ClassifyMisses(ks, 3, AfterMiss, &c)
	want := Counts{Cleared: 1, Expired: 1, AfterMiss: 21}
	if c != want {
		t.Fatalf("counts %v, want %v", c, want)
	}
	NewClassifier(f, g).ClassifyMisses(ks, 0, AfterMiss, &c)
	NewClassifier(f, g).ClassifyMisses(nil, 3, AfterMiss, &c)
	if c != want {
		t.Fatalf("zero per or no keys changed the counts: %v", c)
	}
}

func TestClassifierAllocatesNothing(t *testing.T) {
	f := &fakePool{readable: map[keys.ObjectKey]bool{}, elsewhere: map[keys.ObjectKey]bool{}}
	g := NewGhost(64)
	cl := NewClassifier(f, g)
	ks := cks(0, 100)
	var c Counts
	if n := testing.AllocsPerRun(100, func() { cl.ClassifyMisses(ks, 2, AfterMiss, &c) }); n != 0 {
		t.Fatalf("%v allocations a call", n)
	}
}
