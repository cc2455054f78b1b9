package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/keys"
)

// prompt commits a prompt of n chunks of cs real (chained) hashes for
// ranks objects each and returns its objects.
func prompt(t *testing.T, tr *Tracker, model string, ranks int, seed uint32, n int) []keys.ObjectKey {
	t.Helper()
	h, err := keys.NewHasher(cs, keys.AlgorithmBLAKE3)
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, n*cs)
	for i := range toks {
		toks[i] = seed*1000 + uint32(i)
	}
	c := Commit{Model: model, WorldSize: ranks, Hashes: h.Hashes(toks), Tokens: toks}
	for _, ch := range c.Hashes {
		for r := range ranks {
			k := keys.ObjectKey{Chunk: ch, Model: model, KVRank: uint32(r)}
			tr.Stored(&k)
			c.Keys = append(c.Keys, k)
		}
	}
	commit(tr, c)
	return c.Keys
}

// describe returns the description DescribeTo writes, in memory.
func describe(t *Tracker, stamp int64, maxBytes int, tiers [][]keys.ObjectKey) (data []byte, left int) {
	var b bytes.Buffer
	left, _ = t.DescribeTo(&b, stamp, maxBytes, tiers) // a bytes.Buffer takes every write
	return b.Bytes(), left
}

func drain(tr *Tracker, r *router) {
	for _, b := range tr.Flush() {
		r.apply(b)
	}
}

// TestTrackerReannounce: a new tracker given the old one's description and
// the adopted objects announces, from seq 0 and parents first, exactly the
// old announced set, less what is no longer readable (and its
// descendants); a carried write reservation is announced once committed.
func TestTrackerReannounce(t *testing.T) {
	old := New(Options{BlockSize: cs})
	a := prompt(t, old, "m", 1, 1, 4)
	b := prompt(t, old, "m", 2, 2, 2)
	w := prompt(t, old, "w", 1, 3, 1)
	was := &router{t: t, known: map[uint64]bool{}}
	drain(old, was)
	data, left := describe(old, 42, MaxDescribeBytes, nil)
	if left != 0 || len(was.known) != 4+2+1 {
		t.Fatalf("left %d, announced %d", left, len(was.known))
	}
	published := append(append([]keys.ObjectKey(nil), a...), b...)
	published = append(published, w...)
	gone := a[2] // expired since the keep: chunks 2 and 3 of a go
	carried := keys.ObjectKey{Chunk: keys.Hash{9}, Model: "m"}
	tr := New(Options{BlockSize: cs})
	// The registrations the restart restored, before the re-announcement.
	tr.Registered("m", 1, one)
	tr.Registered("m", 2, one)
	tr.Registered("w", 1, one)
	for _, k := range append(published, carried) {
		tr.Stored(&k) // as the pool's adoption tells the observer
	}
	r, err := tr.Reannounce(data, 42, published, func(ks []keys.ObjectKey) uint64 {
		var m uint64
		for j, k := range ks {
			if k == gone {
				m |= 1 << j
			}
		}
		return m
	})
	if err != nil || r.Chunks != 2+2+1 || r.Described != 7 || r.Dropped != 0 {
		t.Fatalf("reannounced %+v, %v", r, err)
	}
	now := &router{t: t, known: map[uint64]bool{}}
	bs := tr.Flush()
	if len(bs) == 0 || bs[0].Seq != 0 {
		t.Fatalf("batches %+v", bs)
	}
	for _, b := range bs {
		now.apply(b) // fails on a child before its parent
	}
	for i, k := range a {
		if now.known[WireHash(k.Chunk)] != (i < 2) {
			t.Fatalf("chunk %d of a: announced %v", i, now.known[WireHash(k.Chunk)])
		}
	}
	// The carried reservation's commit announces it, with its tokens.
	commit(tr, Commit{Model: "m", WorldSize: 1, Hashes: []keys.Hash{carried.Chunk}, Tokens: make([]uint32, cs), Keys: []keys.ObjectKey{carried}})
	drain(tr, now)
	if !now.known[WireHash(carried.Chunk)] || len(now.known) != 6 {
		t.Fatalf("after the carried commit the router knows %d", len(now.known))
	}
	// Later losses remove as before.
	tr.Lost(&a[0])
	drain(tr, now)
	if now.known[WireHash(a[1].Chunk)] {
		t.Fatal("a descendant of a lost chunk is still announced")
	}
}

// TestReannounceWhileServing: the re-announcement runs while the new
// process serves (Hold, Reannounce, Release). What the data path did
// meanwhile (a new prompt stored after an adopted one, an adopted chunk
// evicted) waits behind it: the stream starts with the adopted chunks that
// are still readable, parents first, then the new prompt; the router is
// told behind while held; the end state is what the calls made. A flood of
// ops past the queue's bounds while held is applied at once, and the set
// stays exact.
func TestReannounceWhileServing(t *testing.T) {
	old := New(Options{BlockSize: cs})
	a := prompt(t, old, "m", 1, 1, 3)
	data, _ := describe(old, 5, MaxDescribeBytes, nil)
	tr := New(Options{BlockSize: cs})
	tr.Registered("m", 1, one)
	for i := range a {
		tr.Stored(&a[i]) // the pool's adoption
	}
	tr.Hold()
	if q := tr.Stats().Queued; q == 0 {
		t.Fatal("held, the stream reads as caught up")
	}
	// Serving: a prompt continuing a's first chunk, and a's last chunk
	// evicted (the pool reports it unreadable from now on).
	h, err := keys.NewHasher(cs, keys.AlgorithmBLAKE3)
	if err != nil {
		t.Fatal(err)
	}
	toks := []uint32{50, 51, 52, 53}
	nk := keys.ObjectKey{Chunk: h.HashesAfter(a[0].Chunk, toks)[0], Model: "m"}
	tr.Stored(&nk)
	tr.Commit(Commit{Model: "m", WorldSize: 1, Parent: a[0].Chunk, HasParent: true, Hashes: []keys.Hash{nk.Chunk},
		Tokens: toks, Keys: []keys.ObjectKey{nk}})
	tr.Lost(&a[2])
	if bs := tr.Flush(); len(bs) != 0 {
		t.Fatalf("held, %d batches published before the re-announcement", len(bs))
	}
	r, err := tr.Reannounce(data, 5, a, func(ks []keys.ObjectKey) uint64 {
		var m uint64
		for j, k := range ks {
			if k == a[2] {
				m |= 1 << j
			}
		}
		return m
	})
	if err != nil || r.Chunks != 2 {
		t.Fatalf("reannounced %+v, %v", r, err)
	}
	tr.Release()
	bs := tr.Flush()
	now := &router{t: t, known: map[uint64]bool{}}
	var order []uint64
	for _, b := range bs {
		now.apply(b) // fails on a child before its parent
		var raw []any
		if err := msgpack.Unmarshal(b.Payload, &raw); err != nil {
			t.Fatal(err)
		}
		for _, e := range raw[1].([]any) {
			for _, x := range e.(map[string]any)["block_hashes"].([]any) {
				order = append(order, toU64(x))
			}
		}
	}
	want := []uint64{WireHash(a[0].Chunk), WireHash(a[1].Chunk), WireHash(nk.Chunk)}
	if !slices.Equal(order, want) {
		t.Fatalf("stream order %x, want %x (a0, a1 re-announced, then the new chunk)", order, want)
	}
	if s := tr.Stats(); s.Queued != 0 || s.Announced != 3 {
		t.Fatalf("after Release: %+v", s)
	}
	// Past the bounds while held: applied at once, the set exact.
	tr.Hold()
	for i := range maxOps + 10 {
		k := keys.ObjectKey{Chunk: hashOf(byte(i)), Model: "m", Layout: uint64(i) + 1}
		tr.Stored(&k)
		tr.Lost(&k)
	}
	if n, _ := tr.waiting(); n > maxOps {
		t.Fatalf("%d ops wait while held, bound %d", n, maxOps)
	}
	tr.Release()
	if s := tr.Stats(); s.Announced != 3 || s.Held != 0 {
		t.Fatalf("after the flood: %+v", s)
	}
}

// TestHostileClearWhileHeld: a Clear while a re-announcement holds the
// tracker, told in bulk only (a pool past ObserveMax objects reports no
// loss one by one for the rest): a store made before it, still waiting
// behind the hold, is not announced after the Release, since the pool no
// longer holds it.
func TestHostileClearWhileHeld(t *testing.T) {
	tr := New(Options{BlockSize: cs})
	tr.Registered("m", 1, one)
	tr.Hold()
	k := keys.ObjectKey{Chunk: hashOf(1), Model: "m"}
	tr.Stored(&k)
	tr.Commit(Commit{Model: "m", WorldSize: 1, Hashes: []keys.Hash{k.Chunk}, Tokens: make([]uint32, cs), Keys: []keys.ObjectKey{k}})
	tr.Cleared()
	tr.Release()
	if s := tr.Stats(); s.Announced != 0 {
		t.Fatalf("a chunk stored before the Clear is announced after it: %+v", s)
	}
}

// TestHostileReannounceDescription: a description is outside input. A
// chunk whose hash is not the chain of its parent and tokens, or whose
// world size is out of range, is left out alone; a description of
// another handover, another chunk size, or not one at all is refused
// whole; one cut short keeps the chunks before the cut; a chunk described
// but not adopted is not announced.
func TestHostileReannounceDescription(t *testing.T) {
	old := New(Options{BlockSize: cs})
	a := prompt(t, old, "m", 1, 1, 1)
	b := prompt(t, old, "m", 1, 2, 1)
	prompt(t, old, "m", 1, 3, 1) // described, never adopted
	data, _ := describe(old, 7, MaxDescribeBytes, nil)
	none := func([]keys.ObjectKey) uint64 { return 0 }
	adopted := append(append([]keys.ObjectKey(nil), a...), b...)
	// The entries are in map order: find each one's tokens by its hash.
	at := func(h keys.Hash) int {
		for i := len(describeMagic) + describeHead; i+32 <= len(data); i++ {
			if string(data[i:i+32]) == string(h[:]) {
				return i
			}
		}
		t.Fatal("hash not in the description")
		return 0
	}
	for _, c := range []struct {
		name   string
		edit   func([]byte) []byte
		stamp  int64
		chunks int
		err    bool
	}{
		{"as written", func(d []byte) []byte { return d }, 7, 2, false},
		{"another handover", func(d []byte) []byte { return d }, 8, 0, true},
		{"not a description", func(d []byte) []byte { return []byte("{}") }, 7, 0, true},
		{"another chunk size", func(d []byte) []byte {
			binary.BigEndian.PutUint32(d[len(describeMagic)+8:], cs*2)
			return d
		}, 7, 0, true},
		{"a token changed", func(d []byte) []byte { d[at(a[0].Chunk)+32+1+32+4] ^= 1; return d }, 7, 1, false},
		{"a parent claimed", func(d []byte) []byte { d[at(b[0].Chunk)+32] = 1; return d }, 7, 1, false},
		{"world size 0", func(d []byte) []byte {
			binary.BigEndian.PutUint32(d[at(a[0].Chunk)+32+1+32:], 0)
			return d
		}, 7, 1, false},
		{"a world size out of range", func(d []byte) []byte {
			binary.BigEndian.PutUint32(d[at(b[0].Chunk)+32+1+32:], keys.MaxWorldSize+1)
			return d
		}, 7, 1, false},
		{"cut short", func(d []byte) []byte { return d[:len(d)-3] }, 7, -1, false},
	} {
		d := c.edit(append([]byte(nil), data...))
		tr := New(Options{BlockSize: cs})
		tr.Registered("m", 1, one)
		for _, k := range adopted {
			tr.Stored(&k)
		}
		r, err := tr.Reannounce(d, c.stamp, adopted, none)
		if c.err != (err != nil) || c.err && !errors.Is(err, ErrDescription) {
			t.Fatalf("%s: err %v", c.name, err)
		}
		if c.chunks >= 0 && r.Chunks != c.chunks || c.chunks < 0 && (r.Chunks > 2 || r.Dropped != 1) {
			t.Fatalf("%s: %+v", c.name, r)
		}
		rt := &router{t: t, known: map[uint64]bool{}}
		drain(tr, rt) // fails on any rule broken
		if len(rt.known) != r.Chunks {
			t.Fatalf("%s: router knows %d, reannounced %d", c.name, len(rt.known), r.Chunks)
		}
	}
}

// TestReannounceCarriesThePollLogOn: the re-announcement leads the new
// poll log under seqs past the old log's, so a poller's old cursor reads
// the re-announced chunks from the first (told lost when it was behind);
// a new log from seq 1 would answer it as a cursor in the future, with
// the newest seq, and the chunks would be skipped. A carried seq out of
// range starts the log at 1.
func TestReannounceCarriesThePollLogOn(t *testing.T) {
	oldLog := NewLog(64, cs, 1)
	old := New(Options{BlockSize: cs, Log: oldLog, NoStream: true})
	a := prompt(t, old, "m", 1, 1, 2)
	cursor := oldLog.Read(0, "m", MaxPollEvents).NextCursor
	if cursor != 2 {
		t.Fatalf("old log: cursor %d after two chunks", cursor)
	}
	data, _ := describe(old, 7, MaxDescribeBytes, nil)
	none := func([]keys.ObjectKey) uint64 { return 0 }
	for _, c := range []struct {
		name  string
		edit  func([]byte)
		first uint64
	}{
		{"as written", func([]byte) {}, 3},
		{"seq out of range", func(d []byte) { binary.BigEndian.PutUint64(d[len(describeMagic)+12:], maxLogSeq+1) }, 1},
	} {
		d := append([]byte(nil), data...)
		c.edit(d)
		newLog := NewLog(64, cs, 2)
		tr := New(Options{BlockSize: cs, Log: newLog, NoStream: true})
		tr.Registered("m", 1, one)
		for _, k := range a {
			tr.Stored(&k) // as the pool's adoption tells the observer
		}
		if _, err := tr.Reannounce(d, 7, a, none); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		p := newLog.Read(cursor, "m", MaxPollEvents)
		if c.first == 1 {
			p = newLog.Read(0, "m", MaxPollEvents)
		}
		if len(p.Events) != 2 || p.Events[0].Seq != c.first {
			t.Fatalf("%s: %d records from seq %v, want 2 from %d", c.name, len(p.Events), p.Events, c.first)
		}
		if c.first == 3 {
			// The cursor is the last seq the old log issued: the new
			// records follow it. An older one is told lost, and reads
			// from the first of them as well.
			if p.Lost {
				t.Fatalf("%s: the old log's last cursor %d told lost", c.name, cursor)
			}
			if q := newLog.Read(cursor-1, "m", MaxPollEvents); !q.Lost || len(q.Events) != 2 || q.Events[0].Seq != 3 {
				t.Fatalf("%s: an older cursor: lost %v, %d records", c.name, q.Lost, len(q.Events))
			}
		}
	}
}

// TestReannounceCarriesTierObjects: the description carries the chunks of
// the tiers' media (also those L1 lost) and the objects each tier held; a
// new tracker keeps them for the tiers, and as each tier tells it still
// holds an object (in any order) the tier's usable set is re-announced
// for STORAGE, parents first. What a tier no longer holds stays out, and
// so do its descendants; the descriptions go with the tier set.
func TestReannounceCarriesTierObjects(t *testing.T) {
	old := New(Options{BlockSize: cs})
	ov := old.SetTiers([]string{""})
	a := prompt(t, old, "m", 1, 1, 4)
	for i := range a {
		ov.Stored(0, &a[i])
	}
	old.Lost(&a[3]) // L1 lost it; the tier holds it still
	held := [][]keys.ObjectKey{a}
	data, left := describe(old, 5, MaxDescribeBytes, held)
	if left != 0 {
		t.Fatalf("left %d", left)
	}

	tr := New(Options{BlockSize: cs})
	tv := tr.SetTiers([]string{""})
	tr.Registered("m", 1, one)
	r, err := tr.Reannounce(data, 5, nil, func([]keys.ObjectKey) uint64 { return 0 })
	if err != nil || r.Chunks != 0 || r.Described != 4 || r.TierObjects != 4 || len(r.Tiers) != 1 || len(r.Tiers[0]) != 4 {
		t.Fatalf("reannounced %+v, %v", r, err)
	}
	sto := &router{t: t, known: map[uint64]bool{}, medium: MediumStorage}
	// The tier tells the last first (a scan's order is the directory's);
	// chunk 2 is gone from it.
	for _, i := range []int{3, 0, 1} {
		tv.Stored(0, &r.Tiers[0][i])
	}
	drain(tr, sto) // fails on a child before its parent
	if len(sto.known) != 2 || !sto.known[WireHash(a[0].Chunk)] || !sto.known[WireHash(a[1].Chunk)] {
		t.Fatalf("STORAGE holds %d blocks, want chunks 0 and 1", len(sto.known))
	}
	tv.Stored(0, &r.Tiers[0][2]) // found after all: 2 and its child 3
	drain(tr, sto)
	if len(sto.known) != 4 {
		t.Fatalf("STORAGE holds %d blocks, want 4", len(sto.known))
	}
	// A new tier set drops what was carried.
	nv := tr.SetTiers([]string{""})
	drain(tr, sto)
	nv.Stored(0, &r.Tiers[0][0])
	drain(tr, sto)
	if len(sto.known) != 0 {
		t.Fatalf("a replaced tier set's carried description announced %d", len(sto.known))
	}
}

// TestHostileReannounceTierObjects: a tier object is kept only for a
// chunk described before it and a tier index under MaxTiers; a record of
// no known kind or one cut short ends the description, keeping what came
// before.
func TestHostileReannounceTierObjects(t *testing.T) {
	old := New(Options{BlockSize: cs})
	a := prompt(t, old, "m", 1, 1, 1)
	stranger := keys.ObjectKey{Chunk: keys.Hash{7}, Model: "m"}
	data, left := describe(old, 5, MaxDescribeBytes, [][]keys.ObjectKey{{a[0], stranger}})
	if left != 0 || bytes.Contains(data, stranger.Chunk[:]) { // the stranger's chunk is not described: not carried
		t.Fatalf("left %d", left)
	}
	tierRec := func(i byte, k keys.ObjectKey) []byte {
		b := []byte{tagTier, i}
		b = appendStr(b, k.Model)
		b = appendStr(b, k.Salt)
		b = append(b, k.Chunk[:]...)
		return append(b, make([]byte, 16)...)
	}
	for _, c := range []struct {
		name           string
		extra          []byte
		objects, drops int
	}{
		{"as written", nil, 1, 0},
		{"of a chunk not described", tierRec(0, stranger), 1, 1},
		{"tier index past the bound", tierRec(MaxTiers, a[0]), 1, 1},
		{"cut short", tierRec(0, a[0])[:20], 1, 1},
		{"no known kind", append([]byte{'x'}, tierRec(0, a[0])...), 1, 1},
	} {
		tr := New(Options{BlockSize: cs})
		tr.SetTiers([]string{""})
		tr.Registered("m", 1, one)
		r, err := tr.Reannounce(append(append([]byte(nil), data...), c.extra...), 5, nil, func([]keys.ObjectKey) uint64 { return 0 })
		if err != nil || r.TierObjects != c.objects || r.Dropped != c.drops || len(r.Tiers) != 1 || len(r.Tiers[0]) != c.objects {
			t.Fatalf("%s: %+v, %v", c.name, r, err)
		}
	}
}

// pieces is a writer that keeps what it is given, each write apart, and
// fails the write numbered failAt (from 1; 0: none).
type pieces struct {
	writes [][]byte
	failAt int
}

var errPieceRefused = errors.New("refused")

func (p *pieces) Write(b []byte) (int, error) {
	if len(p.writes)+1 == p.failAt {
		return 0, errPieceRefused
	}
	p.writes = append(p.writes, slices.Clone(b))
	return len(b), nil
}

// TestDescribeToWritesInPieces: a description of a large pool goes to its
// writer in pieces of about describePiece bytes (never held whole), the
// same bytes describe returns; a bound cuts it past maxBytes, counting
// what it left out; and a writer's error stops it, returned.
func TestDescribeToWritesInPieces(t *testing.T) {
	old := New(Options{BlockSize: cs})
	for p := range 1500 {
		prompt(t, old, "m", 1, uint32(p+1), 4)
	}
	old.Sync()
	whole, left := describe(old, 7, MaxDescribeBytes, nil)
	if left != 0 || len(whole) < 2*describePiece {
		t.Fatalf("description of %d bytes (%d left out): want over two pieces", len(whole), left)
	}
	var w pieces
	if left, err := old.DescribeTo(&w, 7, MaxDescribeBytes, nil); left != 0 || err != nil {
		t.Fatalf("DescribeTo: %d left out, %v", left, err)
	}
	// The chunks come in the tracker's map order: the same records, each
	// of model "m" without a salt the same size here, in another order.
	records := func(b []byte) [][]byte {
		head, size := len(describeMagic)+describeHead, 1+2+1+2+32+1+32+4+4*cs
		if (len(b)-head)%size != 0 {
			t.Fatalf("%d bytes are not records of %d", len(b)-head, size)
		}
		var rs [][]byte
		for i := head; i < len(b); i += size {
			rs = append(rs, b[i:i+size])
		}
		slices.SortFunc(rs, bytes.Compare)
		return append(rs, b[:head])
	}
	if got, want := records(bytes.Join(w.writes, nil)), records(whole); !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("pieces make %d records, Describe %d, or they differ", len(got), len(want))
	}
	for i, b := range w.writes {
		if len(b) > describePiece+describePiece/4 || (i < len(w.writes)-1 && len(b) < describePiece) {
			t.Fatalf("piece %d of %d is %d bytes", i, len(w.writes), len(b))
		}
	}
	bound := len(whole) / 2
	var half pieces
	left, err := old.DescribeTo(&half, 7, bound, nil)
	if n := len(bytes.Join(half.writes, nil)); err != nil || left == 0 || n > bound || n < bound-describePiece {
		t.Fatalf("bounded at %d: %d bytes, %d left out, %v", bound, n, left, err)
	}
	fails := pieces{failAt: 2}
	if _, err := old.DescribeTo(&fails, 7, MaxDescribeBytes, nil); !errors.Is(err, errPieceRefused) || len(fails.writes) != 1 {
		t.Fatalf("a refused write: %v after %d pieces", err, len(fails.writes))
	}
}
