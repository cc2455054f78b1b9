package kvevents

import (
	"math/rand/v2"
	"testing"

	"kvdock/core/keys"
)

// poller is LMCache's connector as its design describes it: records after
// its cursor, an index per medium, everything withdrawn on lost or on a
// new incarnation (lost at first contact ignored).
type poller struct {
	t           *testing.T
	model       string
	cursor      uint64
	incarnation int64
	contact     bool
	index       map[keys.Hash]bool
	resyncs     int
}

func (p *poller) poll(l *Log, max int) Poll {
	p.t.Helper()
	r := l.Read(p.cursor, p.model, max)
	if p.contact && r.Incarnation != p.incarnation || p.contact && r.Lost {
		p.index = map[keys.Hash]bool{}
		p.resyncs++
	}
	p.contact, p.incarnation, p.cursor = true, r.Incarnation, r.NextCursor
	for _, e := range r.Events {
		if e.Model != p.model || e.Medium != MediumCPU {
			p.t.Fatalf("record %d: model %q medium %q", e.Seq, e.Model, e.Medium)
		}
		if e.Stored {
			if len(e.Hashes) != 1 || len(e.Tokens) != cs {
				p.t.Fatalf("stored record %d: %d hashes, %d tokens", e.Seq, len(e.Hashes), len(e.Tokens))
			}
			if e.HasParent && !p.index[e.Parent] && !r.Lost {
				p.t.Fatalf("record %d: child before its parent", e.Seq)
			}
			p.index[e.Hashes[0]] = true
			continue
		}
		for _, h := range e.Hashes {
			delete(p.index, h)
		}
	}
	return r
}

func (p *poller) drain(l *Log) {
	for range 1000 {
		if r := p.poll(l, 7); len(r.Events) == 0 && r.NextCursor == l.Stats().NextSeq-1 {
			return
		}
	}
	p.t.Fatal("poller never caught up")
}

// root stores chunk i as a prompt's first (no parent).
func root(tr *Tracker, model string, i byte) {
	k := keys.ObjectKey{Chunk: hashOf(i), Model: model}
	tr.Stored(&k)
	tr.Commit(Commit{Model: model, Objects: 1, Hashes: []keys.Hash{hashOf(i)}, Tokens: []uint32{1, 2, 3, 4},
		Keys: []keys.ObjectKey{k}})
}

func announcedSet(tr *Tracker, model string) map[keys.Hash]bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := map[keys.Hash]bool{}
	for ek, n := range tr.l1.nodes {
		if n.announced && ek.model == model {
			out[ek.h] = true
		}
	}
	return out
}

func sameSet(a, b map[keys.Hash]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for h := range a {
		if !b[h] {
			return false
		}
	}
	return true
}

// The log's records, read by a poller, rebuild the tracker's announced set
// after random stores, losses and clears, with or without a stream.
func TestLogMirrorsAnnouncedSet(t *testing.T) {
	for _, noStream := range []bool{false, true} {
		log := NewLog(1<<16, cs, 7)
		tr := New(Options{BlockSize: cs, Log: log, NoStream: noStream})
		p := &poller{t: t, model: "m", index: map[keys.Hash]bool{}}
		rng := rand.New(rand.NewPCG(3, 4))
		most := 0
		for step := range 3000 {
			switch x := rng.IntN(20); {
			case x < 12:
				first := byte(1 + rng.IntN(30))
				store(tr, "m", 1, first, first+byte(rng.IntN(4)))
				store(tr, "other", 1, first, first)
			case x < 19:
				lose(tr, "m", 0, byte(1+rng.IntN(34)))
			default:
				tr.Cleared()
			}
			if step%17 == 0 {
				p.drain(log)
				if want := announcedSet(tr, "m"); !sameSet(p.index, want) {
					t.Fatalf("noStream=%v step %d: poller holds %d chunks, tracker announces %d", noStream, step, len(p.index), len(want))
				}
				most = max(most, len(p.index))
			}
		}
		if p.resyncs != 0 || most < 10 {
			t.Fatalf("%d resyncs without loss, at most %d chunks announced", p.resyncs, most)
		}
		if noStream {
			if s := tr.Stats(); s.Queued != 0 || s.StoredEvents != 0 {
				t.Fatalf("no stream, yet %+v", s)
			}
		}
	}
}

// Overflow: a poller whose cursor fell behind the oldest record is told
// lost, resyncs, and converges on the announced set.
func TestLogLostAfterOverflow(t *testing.T) {
	log := NewLog(8, cs, 1)
	tr := New(Options{BlockSize: cs, Log: log})
	p := &poller{t: t, model: "m", index: map[keys.Hash]bool{}}
	store(tr, "m", 1, 1, 3)
	if r := p.poll(log, 100); len(r.Events) != 3 || r.Lost || r.NextCursor != 3 || r.Events[0].Seq != 1 {
		t.Fatalf("first poll %+v", r)
	}
	// 1..3 removed (one record: nothing handed out after 3), then 1..20
	// stored: 24 records into a log of 8.
	lose(tr, "m", 0, 1)
	store(tr, "m", 1, 1, 20)
	r := p.poll(log, 100)
	if !r.Lost || p.resyncs != 1 {
		t.Fatalf("after overflow: lost %v resyncs %d", r.Lost, p.resyncs)
	}
	if st := log.Stats(); st.Depth != 8 || st.Trimmed == 0 || st.LostAnswers != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The records kept are handed out: chunks 13..20 (their parents'
	// records were overwritten, which lost tells the poller).
	if len(p.index) != 8 || !p.index[hashOf(13)] || !p.index[hashOf(20)] {
		t.Fatalf("poller holds %d after the loss", len(p.index))
	}
}

// Removals of one pass share a record until a poll hands it out; a record
// never changes after that.
func TestLogRemovalsCoalesceUntilRead(t *testing.T) {
	log := NewLog(64, cs, 1)
	tr := New(Options{BlockSize: cs, Log: log})
	store(tr, "m", 1, 1, 4)
	lose(tr, "m", 0, 1) // removes 1..4 in one record
	r := log.Read(0, "m", 100)
	if len(r.Events) != 5 || len(r.Events[4].Hashes) != 4 {
		t.Fatalf("records %+v", r.Events)
	}
	root(tr, "m", 10)
	lose(tr, "m", 0, 10)
	lose(tr, "m", 0, 11) // unknown: nothing
	r2 := log.Read(r.NextCursor, "m", 100)
	if len(r2.Events) != 2 || r2.Events[1].Stored || len(r2.Events[1].Hashes) != 1 {
		t.Fatalf("second read %+v", r2.Events)
	}
	root(tr, "m", 20)
	lose(tr, "m", 0, 20)
	if again := log.Read(r.NextCursor, "m", 100); len(again.Events[1].Hashes) != 1 {
		t.Fatalf("a record handed out changed: %+v", again.Events[1])
	}
}

// A chunk held under two salts is announced once and withdrawn with the
// last of them.
func TestLogSaltsShareOneBlock(t *testing.T) {
	log := NewLog(64, cs, 1)
	tr := New(Options{BlockSize: cs, Log: log})
	for _, salt := range []string{"a", "b"} {
		k := keys.ObjectKey{Chunk: hashOf(1), Model: "m", Salt: salt}
		tr.Stored(&k)
		tr.Commit(Commit{Model: "m", Salt: salt, Objects: 1, Hashes: []keys.Hash{hashOf(1)},
			Tokens: []uint32{1, 1, 1, 1}, Keys: []keys.ObjectKey{k}})
	}
	k := keys.ObjectKey{Chunk: hashOf(1), Model: "m", Salt: "a"}
	tr.Lost(&k)
	if r := log.Read(0, "m", 10); len(r.Events) != 1 || !r.Events[0].Stored {
		t.Fatalf("after one salt went: %+v", r.Events)
	}
	k.Salt = "b"
	tr.Lost(&k)
	if r := log.Read(0, "m", 10); len(r.Events) != 2 || r.Events[1].Stored {
		t.Fatalf("after both went: %+v", r.Events)
	}
}

// TestHostileLogReads: cursors beyond the newest record, at the maximum,
// huge and zero max_events, an unknown model: each gets LMCache's answer
// and no read changes what the next one sees.
func TestHostileLogReads(t *testing.T) {
	log := NewLog(16, cs, 9)
	tr := New(Options{BlockSize: cs, Log: log})
	if r := log.Read(5, "m", 10); !r.Lost || r.NextCursor != 0 || len(r.Events) != 0 {
		t.Fatalf("empty log, future cursor: %+v", r)
	}
	if r := log.Read(0, "m", 10); r.Lost || r.NextCursor != 0 {
		t.Fatalf("empty log, cursor 0: %+v", r)
	}
	store(tr, "m", 1, 1, 3)
	before := log.Read(0, "m", 100)
	for _, c := range []uint64{4, 1 << 40, ^uint64(0)} {
		if r := log.Read(c, "m", 10); !r.Lost || r.NextCursor != 3 || len(r.Events) != 0 {
			t.Fatalf("cursor %d: %+v", c, r)
		}
	}
	if r := log.Read(0, "m", 1<<62); len(r.Events) != 3 {
		t.Fatalf("huge max: %d records", len(r.Events))
	}
	if r := log.Read(0, "m", 0); len(r.Events) != 1 || r.NextCursor != 1 {
		t.Fatalf("max 0 reads one: %+v", r)
	}
	if r := log.Read(0, "nobody", 10); len(r.Events) != 0 || r.NextCursor != 3 || r.Lost {
		t.Fatalf("unknown model: %+v", r)
	}
	after := log.Read(0, "m", 100)
	if len(after.Events) != len(before.Events) || after.NextCursor != before.NextCursor || after.Incarnation != 9 {
		t.Fatalf("reads changed the log: %+v then %+v", before, after)
	}
}

// The log holds at most its capacity, however many chunks come and go.
func TestLogBounded(t *testing.T) {
	log := NewLog(100, cs, 1)
	tr := New(Options{BlockSize: cs, Log: log, NoStream: true})
	for i := range 5000 {
		b := byte(1 + i%200)
		root(tr, "m", b)
		lose(tr, "m", 0, b)
	}
	if st := log.Stats(); st.Depth != 100 || st.NextSeq < 5000 {
		t.Fatalf("stats %+v", st)
	}
	if n := len(log.refs); n != 0 {
		t.Fatalf("%d counts left for no announced chunk", n)
	}
}
