package kvevents

import (
	"math/rand/v2"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/keys"
)

const cs = 4

// router is a subscriber's index as llm-d keeps it: a stored block whose
// parent it does not know is dropped; it also checks the rules of the stream.
type router struct {
	t     *testing.T
	known map[uint64]bool
	per   int // tokens per block; 0 = cs
}

func (r *router) apply(b Batch) {
	r.t.Helper()
	var raw []any
	if err := msgpack.Unmarshal(b.Payload, &raw); err != nil || len(raw) != 3 {
		r.t.Fatalf("batch %d: %v (%d fields)", b.Seq, err, len(raw))
	}
	for _, e := range raw[1].([]any) {
		m := e.(map[string]any)
		var hs []uint64
		for _, h := range m["block_hashes"].([]any) {
			hs = append(hs, toU64(h))
		}
		switch m["type"] {
		case "BlockStored":
			if p := m["parent_block_hash"]; p != nil && !r.known[toU64(p)] {
				r.t.Fatalf("batch %d: child %x before its parent %x", b.Seq, hs[0], toU64(p))
			}
			per := r.per
			if per == 0 {
				per = cs
			}
			if n := len(m["token_ids"].([]any)); n != len(hs)*per {
				r.t.Fatalf("batch %d: %d tokens for %d blocks", b.Seq, n, len(hs))
			}
			for _, h := range hs {
				if r.known[h] {
					r.t.Fatalf("batch %d: %x announced twice", b.Seq, h)
				}
				r.known[h] = true
			}
		case "BlockRemoved":
			for _, h := range hs {
				if !r.known[h] {
					r.t.Fatalf("batch %d: removal of %x, not announced", b.Seq, h)
				}
				delete(r.known, h)
			}
		default:
			r.t.Fatalf("batch %d: event %v", b.Seq, m["type"])
		}
	}
}

func toU64(v any) uint64 {
	switch x := v.(type) {
	case uint64:
		return x
	case int64:
		return uint64(x)
	case uint8:
		return uint64(x)
	case int8:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint32:
		return uint64(x)
	case int16:
		return uint64(x)
	case int32:
		return uint64(x)
	}
	panic(v)
}

func hashOf(i byte) keys.Hash { var h keys.Hash; h[31], h[0] = i, i; return h }

// store stores chunks first..last of a prompt (hash i = hashOf(i), chained)
// for ranks objects each, committing every rank's keys in one commit.
func store(tr *Tracker, model string, ranks int, first, last byte) {
	var c Commit
	c.Model, c.Objects = model, ranks
	if first > 1 {
		c.Parent, c.HasParent = hashOf(first-1), true
	}
	for i := first; i <= last; i++ {
		c.Hashes = append(c.Hashes, hashOf(i))
		c.Tokens = append(c.Tokens, uint32(i), uint32(i), uint32(i), uint32(i))
		for r := range ranks {
			k := keys.ObjectKey{Chunk: hashOf(i), Model: model, KVRank: uint32(r)}
			tr.Stored(&k)
			c.Keys = append(c.Keys, k)
		}
	}
	tr.Commit(c)
}

func lose(tr *Tracker, model string, rank uint32, i byte) {
	k := keys.ObjectKey{Chunk: hashOf(i), Model: model, KVRank: rank}
	tr.Lost(&k)
}

func TestTrackerRules(t *testing.T) {
	tr := New(Options{BlockSize: cs})
	r := &router{t: t, known: map[uint64]bool{}}
	flush := func() {
		for _, b := range tr.Flush() {
			r.apply(b)
		}
	}
	want := func(hs ...byte) {
		t.Helper()
		flush()
		if len(r.known) != len(hs) {
			t.Fatalf("router knows %d blocks, want %v", len(r.known), hs)
		}
		for _, h := range hs {
			if !r.known[WireHash(hashOf(h))] {
				t.Fatalf("router lacks %d; want %v", h, hs)
			}
		}
	}
	store(tr, "m", 1, 1, 3)
	want(1, 2, 3)
	lose(tr, "m", 0, 2) // an eviction in the middle removes the descendants
	want(1)
	store(tr, "m", 1, 5, 6) // parent 4 missing: held back
	want(1)
	store(tr, "m", 1, 4, 4) // still held: 2 is gone
	want(1)
	if s := tr.Stats(); s.Held != 4 || s.Announced != 1 {
		t.Fatalf("stats %+v", s)
	}
	store(tr, "m", 1, 2, 3) // the parents return: all announced
	want(1, 2, 3, 4, 5, 6)
	// Several ranks: announced when the last commits, removed when the first goes.
	store(tr, "m", 1, 7, 7)
	want(1, 2, 3, 4, 5, 6, 7)
	tr.Cleared()
	want()
	store(tr, "w", 2, 1, 1)
	want(1)
	lose(tr, "w", 1, 1)
	want()
	lose(tr, "w", 0, 1) // the second rank's loss: no second removal
	want()
	// A commit whose objects were lost first announces nothing.
	k := keys.ObjectKey{Chunk: hashOf(9), Model: "m"}
	tr.Stored(&k)
	tr.Lost(&k)
	tr.Commit(Commit{Model: "m", Objects: 1, Hashes: []keys.Hash{hashOf(9)}, Tokens: make([]uint32, cs), Keys: []keys.ObjectKey{k}})
	want()
	// Bench traffic is not announced.
	store(tr, keys.BenchModelPrefix+"x", 1, 1, 2)
	want()
	if s := tr.Stats(); s.Batches == 0 || s.NextSeq != s.Batches {
		t.Fatalf("stats %+v", s)
	}
}

func TestTrackerRanksWaitForAll(t *testing.T) {
	tr := New(Options{BlockSize: cs})
	k0 := keys.ObjectKey{Chunk: hashOf(1), Model: "m", KVRank: 0}
	k1 := keys.ObjectKey{Chunk: hashOf(1), Model: "m", KVRank: 1}
	tr.Stored(&k0)
	tr.Stored(&k1)
	c := Commit{Model: "m", Objects: 2, Hashes: []keys.Hash{hashOf(1)}, Tokens: make([]uint32, cs), Keys: []keys.ObjectKey{k0}}
	tr.Commit(c)
	if bs := tr.Flush(); len(bs) != 0 {
		t.Fatalf("announced with one rank of two: %d batches", len(bs))
	}
	c.Keys = []keys.ObjectKey{k1}
	tr.Commit(c)
	if bs := tr.Flush(); len(bs) != 1 || bs[0].Seq != 0 {
		t.Fatalf("batches %+v", bs)
	}
}

func TestTrackerReplayBounded(t *testing.T) {
	tr := New(Options{BlockSize: cs, BufferSteps: 3})
	for i := byte(1); i <= 5; i++ {
		store(tr, "m", 1, i, i)
		tr.Flush()
	}
	bs := tr.Since(0)
	if len(bs) != 3 || bs[0].Seq != 2 || bs[2].Seq != 4 {
		t.Fatalf("replay %+v", bs)
	}
	if bs := tr.Since(4); len(bs) != 1 || bs[0].Seq != 4 {
		t.Fatalf("replay from 4: %+v", bs)
	}
}

func TestTrackerQueueBounded(t *testing.T) {
	tr := New(Options{BlockSize: cs, MaxQueued: 2})
	store(tr, "a", 1, 1, 1)
	store(tr, "b", 1, 1, 1)
	store(tr, "c", 1, 1, 1)
	if s := tr.Stats(); s.Dropped != 1 || s.Queued != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestEncodeArrayForm(t *testing.T) {
	p := encodeBatch(1.5, []Event{{Stored: true, Hashes: []uint64{1 << 63}, Tokens: []uint32{1, 2}}, {Hashes: []uint64{7}}}, 2, "CPU", true, 0)
	var raw []any
	if err := msgpack.Unmarshal(p, &raw); err != nil {
		t.Fatal(err)
	}
	evs := raw[1].([]any)
	st := evs[0].([]any)
	if len(st) != 8 || st[0] != "BlockStored" || toU64(st[1].([]any)[0]) != 1<<63 || st[2] != nil || st[6] != "CPU" {
		t.Fatalf("stored %v", st)
	}
	rm := evs[1].([]any)
	if len(rm) != 3 || rm[0] != "BlockRemoved" || rm[2] != "CPU" {
		t.Fatalf("removed %v", rm)
	}
}

// recount is the announced and held counts computed from scratch.
func (t *Tracker) recount() (announced, held int) {
	for ek, n := range t.nodes {
		if n.announced {
			announced++
		} else if n.whole() {
			held++
			if t.usable(ek, n) {
				announced = -1 << 30 // usable and not announced: a broken rule
			}
		}
	}
	return announced, held
}

// Random stores (two ranks, shared prefixes), losses and clears: after each
// step the counters equal a recount, nothing usable stays unannounced, and
// a router's index equals the announced set.
func TestTrackerRandomModel(t *testing.T) {
	for _, per := range []int{0, 2} {
		rng := rand.New(rand.NewPCG(1, 2))
		tr := New(Options{BlockSize: cs, EventBlockSize: per})
		r := &router{t: t, known: map[uint64]bool{}, per: per}
		for step := range 5000 {
			switch op := rng.IntN(10); {
			case op < 5:
				first := byte(1 + rng.IntN(12))
				store(tr, "m", 2, first, first+byte(rng.IntN(4)))
			case op < 9:
				lose(tr, "m", uint32(rng.IntN(2)), byte(1+rng.IntN(15)))
			default:
				if rng.IntN(20) == 0 {
					tr.Cleared()
				}
			}
			for _, b := range tr.Flush() {
				r.apply(b)
			}
			tr.mu.Lock()
			a, h := tr.recount()
			s := tr.st
			blocks := 0
			for _, nd := range tr.nodes {
				if nd.announced {
					blocks++
				}
			}
			tr.mu.Unlock()
			if per == 2 {
				blocks *= cs / per // the test's chunks share no blocks
			}
			if a != s.Announced || h != s.Held || len(r.known) != blocks {
				t.Fatalf("block %d, step %d: counted announced %d held %d, recount %d %d, router %d blocks, want %d",
					per, step, s.Announced, s.Held, a, h, len(r.known), blocks)
			}
		}
	}
}

// With EventBlockSize 2 of a chunk of 4, each chunk is announced as two
// blocks named as a chunk-size-2 server names them; a block two announced
// chunks share is announced once and removed with the last of them.
func TestTrackerSplitsChunks(t *testing.T) {
	tr := New(Options{BlockSize: 4, EventBlockSize: 2})
	small, err := keys.NewHasher(2, keys.AlgorithmBLAKE3)
	if err != nil {
		t.Fatal(err)
	}
	big, _ := keys.NewHasher(4, keys.AlgorithmBLAKE3)
	known := map[uint64]int{}
	apply := func() {
		t.Helper()
		for _, b := range tr.Flush() {
			var raw []any
			if err := msgpack.Unmarshal(b.Payload, &raw); err != nil {
				t.Fatal(err)
			}
			for _, e := range raw[1].([]any) {
				m := e.(map[string]any)
				if m["type"] == "BlockStored" {
					if p := m["parent_block_hash"]; p != nil && known[toU64(p)] == 0 {
						t.Fatalf("block before its parent")
					}
					if toU64(m["block_size"]) != 2 || len(m["token_ids"].([]any)) != 2*len(m["block_hashes"].([]any)) {
						t.Fatalf("event %v", m)
					}
				}
				for _, h := range m["block_hashes"].([]any) {
					if m["type"] == "BlockStored" {
						known[toU64(h)]++
					} else {
						delete(known, toU64(h))
					}
				}
			}
		}
	}
	commit := func(toks []uint32) {
		hs := big.Hashes(toks)
		c := Commit{Model: "m", Objects: 1, Hashes: hs, Tokens: toks}
		for _, h := range hs {
			k := keys.ObjectKey{Chunk: h, Model: "m"}
			tr.Stored(&k)
			c.Keys = append(c.Keys, k)
		}
		tr.Commit(c)
	}
	a := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	b := []uint32{1, 2, 3, 4, 5, 6, 9, 9} // shares a's first chunk and the block 5 6
	commit(a)
	commit(b)
	apply()
	want := map[uint64]bool{}
	for _, toks := range [][]uint32{a, b} {
		for _, h := range small.Hashes(toks) {
			want[WireHash(h)] = true
		}
	}
	if len(known) != len(want) || len(want) != 5 {
		t.Fatalf("router holds %d blocks, want %d", len(known), len(want))
	}
	for h, n := range known {
		if !want[h] || n != 1 {
			t.Fatalf("block %x announced %d times (wanted: %v)", h, n, want[h])
		}
	}
	// b's second chunk goes: only its own block 9 9 is removed.
	k := keys.ObjectKey{Chunk: big.Hashes(b)[1], Model: "m"}
	tr.Lost(&k)
	apply()
	if len(known) != 4 || known[WireHash(small.Hashes(b)[2])] != 1 {
		t.Fatalf("after b's second chunk went: %d blocks", len(known))
	}
	tr.Cleared()
	apply()
	if len(known) != 0 {
		t.Fatalf("after a clear: %d blocks", len(known))
	}
}
