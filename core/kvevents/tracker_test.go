package kvevents

import (
	"bytes"
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/keys"
)

const cs = 4

// router is a subscriber's index as llm-d keeps it: a stored block whose
// parent it does not know is dropped; it also checks the rules of the stream.
type router struct {
	t      *testing.T
	known  map[uint64]bool
	per    int    // tokens per block; 0 = cs
	medium string // the medium indexed; "" = CPU (events of others are skipped)
}

func (r *router) apply(b Batch) {
	r.t.Helper()
	var raw []any
	if err := msgpack.Unmarshal(b.Payload, &raw); err != nil || len(raw) != 3 {
		r.t.Fatalf("batch %d: %v (%d fields)", b.Seq, err, len(raw))
	}
	for _, e := range raw[1].([]any) {
		m := e.(map[string]any)
		if med := cmp.Or(r.medium, MediumCPU); m["medium"] != med {
			continue
		}
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
// for ranks objects each, committing every rank's keys in one commit, with
// (model, ranks) registered.
func store(tr *Tracker, model string, ranks int, first, last byte) {
	tr.Registered(model, ranks, one)
	storeAsIs(tr, model, ranks, first, last)
}

// storeAsIs is store with the registrations as they are.
func storeAsIs(tr *Tracker, model string, ranks int, first, last byte) {
	var c Commit
	c.Model, c.WorldSize = model, ranks
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
	commit(tr, Commit{Model: "m", WorldSize: 1, Hashes: []keys.Hash{hashOf(9)}, Tokens: make([]uint32, cs), Keys: []keys.ObjectKey{k}})
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
	c := Commit{Model: "m", WorldSize: 2, Hashes: []keys.Hash{hashOf(1)}, Tokens: make([]uint32, cs), Keys: []keys.ObjectKey{k0}}
	commit(tr, c)
	if bs := tr.Flush(); len(bs) != 0 {
		t.Fatalf("announced with one rank of two: %d batches", len(bs))
	}
	c.Keys = []keys.ObjectKey{k1}
	commit(tr, c)
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

// TestTrackerQueuedUntilNumbered: while a flush encodes the records it
// took, Stats counts them queued and NextSeq is not yet past them, so a
// reader that sees Queued 0 knows every event is in a batch numbered below
// NextSeq (what a router's catch-up check relies on).
func TestTrackerQueuedUntilNumbered(t *testing.T) {
	var tr *Tracker
	var during Stats
	tr = New(Options{BlockSize: cs, Now: func() time.Time {
		during = tr.Stats() // Flush reads the clock between taking the records and numbering them
		return time.Unix(1, 0)
	}})
	store(tr, "m", 1, 1, 3)
	if s := tr.Stats(); s.Queued != 3 || s.NextSeq != 0 { // one record a chunk
		t.Fatalf("before the flush: %+v", s)
	}
	if bs := tr.Flush(); len(bs) != 1 {
		t.Fatalf("%d batches", len(bs))
	}
	if during.Queued != 3 || during.NextSeq != 0 {
		t.Fatalf("during the flush: %+v", during)
	}
	if s := tr.Stats(); s.Queued != 0 || s.NextSeq != 1 {
		t.Fatalf("after the flush: %+v", s)
	}
}

func TestEncodeArrayForm(t *testing.T) {
	p := encodeBatch(nil, 1.5, []Event{{Stored: true, Medium: "CPU", Hashes: []uint64{1 << 63}, Tokens: [][]uint32{{1, 2}}}, {Medium: "CPU", Hashes: []uint64{7}}}, 2, true, 0)
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

// recount is m's announced and held counts computed from scratch.
func (t *Tracker) recount(m *medium) (announced, held int) {
	for ek, n := range m.nodes {
		if n.announced {
			announced++
			if !t.usable(m, n, ek) {
				announced = -1 << 30 // announced and not usable: a broken rule
			}
		} else if t.whole(ek.model, n) {
			held++
			if t.usable(m, n, ek) {
				announced = -1 << 30 // usable and not announced: a broken rule
			}
		}
	}
	return announced, held
}

// Random stores (two ranks, shared prefixes), losses, clears, the
// writes and losses of two tiers of one STORAGE medium, and the model's
// registrations changing (its last worker unregistered, its layout
// registered again, a second layout registered beside it, which LOOKUP
// then asks of every chunk too): after each step each medium's counters
// equal a recount, nothing usable stays unannounced and nothing announced
// is unusable, and a router's index of each medium equals its announced
// set (the router fails on a removal of a hash not announced, or twice).
func TestTrackerRandomModel(t *testing.T) {
	for _, per := range []int{0, 2} {
		rng := rand.New(rand.NewPCG(1, 2))
		tr := New(Options{BlockSize: cs, EventBlockSize: per})
		tv := tr.SetTiers([]string{"", MediumStorage})
		tr.Registered("m", 2, one)
		r := &router{t: t, known: map[uint64]bool{}, per: per}
		rs := &router{t: t, known: map[uint64]bool{}, per: per, medium: MediumStorage}
		// in is what each tier holds, as a tier tells it: a value once.
		in := [2]map[keys.ObjectKey]bool{{}, {}}
		unregistered := 0
		for step := range 5000 {
			switch op := rng.IntN(15); {
			case op == 14:
				switch rng.IntN(3) {
				case 0:
					tr.Registered("m", 2, Layouts{})
					unregistered++
				case 1:
					tr.Registered("m", 2, one)
				default:
					tr.Registered("m", 2, Layouts{IDs: []uint64{0, 7}, Groups: []int{1, 1}})
				}
			case op < 5:
				first := byte(1 + rng.IntN(12))
				storeAsIs(tr, "m", 2, first, first+byte(rng.IntN(4)))
			case op < 9:
				lose(tr, "m", uint32(rng.IntN(2)), byte(1+rng.IntN(15)))
			case op < 13:
				i := rng.IntN(2)
				k := keys.ObjectKey{Chunk: hashOf(byte(1 + rng.IntN(15))), Model: "m", KVRank: uint32(rng.IntN(2))}
				switch {
				case in[i][k] && op == 12:
					delete(in[i], k)
					tv.Lost(i, &k)
				case !in[i][k] && op < 12:
					tr.mu.Lock()
					src := tr.l1.nodes[keyOf(&k)]
					resident := src != nil && src.ws > 0 && slices.ContainsFunc(src.objs, func(o obj) bool { return o.rank == k.KVRank && o.committed })
					tr.mu.Unlock()
					if resident { // a tier writes only committed objects
						in[i][k] = true
						tv.Stored(i, &k)
					}
				}
			default:
				if rng.IntN(20) == 0 {
					tr.Cleared()
				}
			}
			for _, b := range tr.Flush() {
				r.apply(b)
				rs.apply(b)
			}
			tr.mu.Lock()
			a, h := tr.recount(tr.l1)
			as, hs := tr.recount(tr.tiers[0])
			la, lh, sa, sh := tr.l1.announced, tr.l1.held, tr.tiers[0].announced, tr.tiers[0].held
			blocks, sblocks := 0, 0
			for _, nd := range tr.l1.nodes {
				if nd.announced {
					blocks++
				}
			}
			for _, nd := range tr.tiers[0].nodes {
				if nd.announced {
					sblocks++
				}
			}
			shared := tr.tiers[0] == tr.tiers[1]
			tr.mu.Unlock()
			if per == 2 {
				blocks *= cs / per // the test's chunks share no blocks
				sblocks *= cs / per
			}
			if !shared || a != la || h != lh || as != sa || hs != sh || len(r.known) != blocks || len(rs.known) != sblocks {
				t.Fatalf("block %d, step %d: CPU counted announced %d held %d, recount %d %d, router %d blocks, want %d; "+
					"STORAGE counted %d %d, recount %d %d, router %d, want %d",
					per, step, la, lh, a, h, len(r.known), blocks, sa, sh, as, hs, len(rs.known), sblocks)
			}
			if s := tr.Stats(); s.Announced != la+sa || s.Held != lh+sh {
				t.Fatalf("step %d: stats %+v, want announced %d held %d", step, s, la+sa, lh+sh)
			}
		}
		if s := tr.Stats(); s.StoredEvents == 0 || len(rs.known) == 0 && s.RemovedEvents == 0 || unregistered == 0 {
			t.Fatalf("block %d: the random run announced nothing in STORAGE or never unregistered: %+v", per, s)
		}
	}
}

// A tier's medium: a chunk is announced there once its tier holds every
// object of it and its parent is announced there, whatever L1 does; its
// removal from the last tier of the medium holding it removes it and its
// descendants there; a value whose L1 chunk was never committed, a loss
// told twice, a tier out of range and a clear of L1 change nothing there.
func TestTrackerTierMedium(t *testing.T) {
	tr := New(Options{BlockSize: cs})
	tv := tr.SetTiers([]string{"", MediumStorage, "NVME"})
	cpu := &router{t: t, known: map[uint64]bool{}}
	sto := &router{t: t, known: map[uint64]bool{}, medium: MediumStorage}
	nvme := &router{t: t, known: map[uint64]bool{}, medium: "NVME"}
	want := func(r *router, hs ...byte) {
		t.Helper()
		for _, b := range tr.Flush() {
			cpu.apply(b)
			sto.apply(b)
			nvme.apply(b)
		}
		if len(r.known) != len(hs) {
			t.Fatalf("%q router knows %d blocks, want %v", r.medium, len(r.known), hs)
		}
		for _, h := range hs {
			if !r.known[WireHash(hashOf(h))] {
				t.Fatalf("%q router lacks %d; want %v", r.medium, h, hs)
			}
		}
	}
	key := func(i byte) *keys.ObjectKey { return &keys.ObjectKey{Chunk: hashOf(i), Model: "m"} }
	store(tr, "m", 1, 1, 3)
	want(cpu, 1, 2, 3)
	tv.Stored(0, key(2)) // its parent is not in the tier yet: held back
	want(sto)
	tv.Stored(0, key(1))
	want(sto, 1, 2)
	tv.Stored(1, key(1)) // a second tier of STORAGE: no second announcement
	tv.Stored(0, key(3))
	tv.Stored(2, key(1)) // NVME, a medium of its own
	want(sto, 1, 2, 3)
	want(nvme, 1)
	lose(tr, "m", 0, 1) // L1 loses the root: CPU removes all, the tiers keep theirs
	want(cpu)
	want(sto, 1, 2, 3)
	tv.Lost(0, key(1)) // tier 1 still holds it
	want(sto, 1, 2, 3)
	tv.Lost(1, key(1)) // the last STORAGE tier lets it go: descendants too
	want(sto)
	tv.Lost(1, key(1)) // told twice: no second removal
	tv.Lost(0, key(9)) // never held
	tv.Lost(7, key(2)) // no such tier
	tv.Lost(-1, key(2))
	want(sto)
	want(nvme, 1)
	tr.Cleared() // a clear of L1 leaves the tiers' media as they are
	want(nvme, 1)
	// A value whose L1 chunk was never committed (an earlier run's) is not
	// announced, nor is a chunk's value whose L1 commit was lost first.
	tv.Stored(0, key(12))
	k := key(13)
	tr.Stored(k)
	tv.Stored(0, k)
	want(sto)
	// Bench traffic is not announced in a tier's medium either.
	store(tr, keys.BenchModelPrefix+"x", 1, 1, 1)
	tv.Stored(0, &keys.ObjectKey{Chunk: hashOf(1), Model: keys.BenchModelPrefix + "x"})
	want(sto)
	// The parent returns to STORAGE: the held chunks are announced after it.
	store(tr, "m", 1, 1, 1)
	tv.Stored(0, key(1))
	want(sto, 1, 2, 3)
	if s := tr.Stats(); s.Announced != 1+3+1 || s.Held != 0 {
		t.Fatalf("stats %+v", s)
	}
	// A prefetch loads 3 and 2 back into a cleared L1 (children first, as
	// its loads may land): announced for CPU once the parent is there, with
	// the chunk's tokens and parent from STORAGE; a value no tier knows is not.
	tr.Cleared()
	want(cpu)
	for _, i := range []byte{3, 2, 1, 12} {
		tr.Stored(key(i))
		tr.Loaded([]keys.ObjectKey{*key(i)})
	}
	want(cpu, 1, 2, 3)
	// The tiers are replaced (a live change of the L2 settings): the old
	// media are removed whole, and what the old set still tells is ignored.
	nv := tr.SetTiers([]string{"NVME"})
	want(sto)
	want(nvme)
	tv.Stored(2, key(1))
	tv.Lost(0, key(1))
	want(nvme)
	nv.Stored(0, key(1))
	want(nvme, 1)
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
		c := Commit{Model: "m", WorldSize: 1, Hashes: hs, Tokens: toks}
		for _, h := range hs {
			k := keys.ObjectKey{Chunk: h, Model: "m"}
			tr.Stored(&k)
			c.Keys = append(c.Keys, k)
		}
		commit(tr, c)
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

// TestEncodeFormsDecode: the hand-written msgpack decodes, at every size
// boundary of its integers, strings and arrays, to what was encoded.
func TestEncodeFormsDecode(t *testing.T) {
	ints := []uint64{0, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<64 - 1}
	for _, v := range ints {
		var got uint64
		if err := msgpack.Unmarshal(mpUint(nil, v), &got); err != nil || got != v {
			t.Fatalf("uint %d: %d, %v", v, got, err)
		}
		// Token ids are written in place, in the same forms, byte for byte.
		if v <= math.MaxUint32 && !bytes.Equal(appendTokens([]byte{0xc0}, []uint32{uint32(v)}), mpUint([]byte{0xc0}, v)) {
			t.Fatalf("token %d: % x, want % x", v, appendTokens(nil, []uint32{uint32(v)}), mpUint(nil, v))
		}
	}
	for _, n := range []int{0, 31, 32, 255, 256, 65535, 65536} {
		s := string(make([]byte, n))
		var got string
		if err := msgpack.Unmarshal(mpStr(nil, s), &got); err != nil || got != s {
			t.Fatalf("str of %d: %d bytes, %v", n, len(got), err)
		}
	}
	for _, n := range []int{0, 15, 16, 65535, 65536} {
		want := make([]uint32, n)
		ev := Event{Stored: true, Medium: "STORAGE", Hashes: make([]uint64, n), Tokens: [][]uint32{want[:n/2], want[n/2:]}}
		for i := range n {
			ev.Hashes[i], want[i] = ints[i%len(ints)], uint32(ints[i%8])
		}
		var raw []any
		if err := msgpack.Unmarshal(encodeBatch(nil, 2.5, []Event{ev, {Medium: "CPU", Hashes: ev.Hashes}}, 16, false, 3), &raw); err != nil {
			t.Fatalf("%d: %v", n, err)
		}
		evs := raw[1].([]any)
		st, rm := evs[0].(map[string]any), evs[1].(map[string]any)
		hs, toks := st["block_hashes"].([]any), st["token_ids"].([]any)
		if raw[0] != 2.5 || toU64(raw[2]) != 3 || len(hs) != n || len(toks) != n || st["medium"] != "STORAGE" ||
			toU64(st["block_size"]) != 16 || st["parent_block_hash"] != nil || len(st) != 8 || rm["medium"] != "CPU" || len(rm) != 3 {
			t.Fatalf("%d: batch %v", n, raw[0])
		}
		for i := range n {
			if toU64(hs[i]) != ev.Hashes[i] || toU64(toks[i]) != uint64(want[i]) {
				t.Fatalf("%d: item %d: %v %v", n, i, hs[i], toks[i])
			}
		}
	}
}

// one is the layouts of a worker registered with one layout (ID 0, the
// layout of the tests' keys) and one KV group.
var one = Layouts{IDs: []uint64{0}, Groups: []int{1}}

// commit registers c's model and world size with one layout, as a worker
// registers before it stores, and commits c.
func commit(tr *Tracker, c Commit) {
	tr.Registered(c.Model, c.WorldSize, one)
	tr.Commit(c)
}

// TestTrackerFollowsRegistrations: LOOKUP counts a chunk only for the
// layouts registered for its model, so the announced set follows them in
// every medium and in the poll log: the last worker's unregister removes
// every chunk of the model (each announced hash once, none that was not),
// a registration of the same layout announces them again parents first, a
// second layout registered beside it (LOOKUP then asks every chunk of it
// too) removes those it lacks, and a call that changes nothing, a bench
// model or a malformed list sends nothing. (The poll log's side:
// TestLogMirrorsAnnouncedSet.)
func TestTrackerFollowsRegistrations(t *testing.T) {
	tr := New(Options{BlockSize: cs})
	tv := tr.SetTiers([]string{""})
	cpu := &router{t: t, known: map[uint64]bool{}}
	sto := &router{t: t, known: map[uint64]bool{}, medium: MediumStorage}
	flush := func() int {
		bs := tr.Flush()
		for _, b := range bs {
			cpu.apply(b)
			sto.apply(b)
		}
		return len(bs)
	}
	want := func(what string, cpuN, stoN int) {
		t.Helper()
		flush()
		if len(cpu.known) != cpuN || len(sto.known) != stoN {
			t.Fatalf("%s: CPU %d STORAGE %d blocks, want %d %d", what, len(cpu.known), len(sto.known), cpuN, stoN)
		}
	}
	store(tr, "m", 1, 1, 3)
	root(tr, "w", 20)               // another model's chunk stays throughout
	for i := byte(1); i <= 2; i++ { // the tier holds chunks 1 and 2
		k := keys.ObjectKey{Chunk: hashOf(i), Model: "m"}
		tv.Stored(0, &k)
	}
	want("stored", 4, 2)
	tr.Registered("m", 1, one) // another worker of the same layout
	if n := flush(); n != 0 {
		t.Fatalf("a registration that changes nothing sent %d batches", n)
	}
	tr.Registered("m", 2, Layouts{}) // another world size: not m's chunks
	tr.Registered(keys.BenchModelPrefix+"m", 1, Layouts{})
	tr.Registered("m", 1, Layouts{IDs: []uint64{0}}) // malformed: ignored
	want("unrelated", 4, 2)
	tr.Registered("m", 1, Layouts{}) // the last worker of m went
	want("unregistered", 1, 0)
	if s := tr.Stats(); s.Announced != 1 || s.Held != 0 {
		t.Fatalf("stats after the unregister %+v", s)
	}
	// Evicted while unregistered: it does not come back.
	lose(tr, "m", 0, 3)
	tr.Registered("m", 1, one)
	want("registered again", 3, 2) // w's, m's 1 and 2; the router fails on a child first
	// A second layout beside it: every chunk must have its objects too.
	two := Layouts{IDs: []uint64{0, 9}, Groups: []int{1, 1}}
	tr.Registered("m", 1, two)
	want("second layout", 1, 0)
	k := keys.ObjectKey{Chunk: hashOf(1), Model: "m", Layout: 9}
	tr.Stored(&k)
	tr.Commit(Commit{Model: "m", WorldSize: 1, Hashes: []keys.Hash{hashOf(1)}, Tokens: make([]uint32, cs), Keys: []keys.ObjectKey{k}})
	want("second layout's first chunk", 2, 0)
	tv.Stored(0, &k)
	want("second layout's first chunk in the tier", 2, 1)
	tr.Registered("m", 1, Layouts{IDs: []uint64{9}, Groups: []int{1}}) // the first layout's workers went
	want("first layout gone", 2, 1)
}

// TestHostileReplayBufferBoundedByBytes: a steady stream of stores makes
// batches of tens of KiB, and BufferSteps (10,000 by default) of them
// would hold hundreds of MiB; the buffer keeps at most MaxBufferBytes of
// payloads, the newest, in order.
func TestHostileReplayBufferBoundedByBytes(t *testing.T) {
	tr := New(Options{BlockSize: cs})
	payload := make([]byte, 1<<20)
	tr.mu.Lock()
	for i := range 100 {
		tr.keep(Batch{Seq: uint64(i), Model: "m", Events: 1, Payload: payload})
	}
	tr.mu.Unlock()
	st := tr.Stats()
	if st.BufferedBytes > MaxBufferBytes || st.Buffered != MaxBufferBytes>>20 || st.BufferTrimmed != uint64(100-st.Buffered) {
		t.Fatalf("buffer of 100 batches of 1 MiB: %d batches, %d bytes, %d trimmed", st.Buffered, st.BufferedBytes, st.BufferTrimmed)
	}
	bs := tr.Since(0)
	for i, b := range bs {
		if b.Seq != uint64(100-len(bs)+i) {
			t.Fatalf("replay %d has seq %d: not the newest in order", i, b.Seq)
		}
	}
	// One batch past the bound on its own is kept (the newest always is).
	tr.mu.Lock()
	tr.keep(Batch{Seq: 100, Payload: make([]byte, MaxBufferBytes+1)})
	tr.mu.Unlock()
	if bs := tr.Since(0); len(bs) != 1 || bs[0].Seq != 100 {
		t.Fatalf("after an oversized batch the buffer holds %d batches", len(bs))
	}
}
