package kvevents

import (
	"sync"
	"testing"
	"time"

	"kvdock/core/keys"
)

// TestHostileOpsBoundedWithoutAReader: the poll log alone (kvdock's
// default: no publisher) and nobody polling, a peer storing and evicting
// without pause, and commits of huge prompts: what waits to be applied
// stays within maxOps ops and maxOpTokens tokens (plus the one call that
// crossed the bound), and once applied the set is what the calls made.
func TestHostileOpsBoundedWithoutAReader(t *testing.T) {
	tr := New(Options{BlockSize: cs, NoStream: true, Log: NewLog(DefaultLogSize, cs, 1)})
	tr.Registered("m", 1, one)
	most, mostTokens := 0, 0
	note := func() {
		n, tok := tr.waiting()
		most, mostTokens = max(most, n), max(mostTokens, tok)
	}
	for i := range 3 * maxOps {
		k := keys.ObjectKey{Chunk: hashOf(byte(i)), Model: "m", Layout: uint64(i)}
		tr.Stored(&k)
		tr.Lost(&k)
		note()
	}
	// A prompt of 1M tokens per commit: 4 MiB each, held while it waits.
	big := make([]uint32, 1<<20)
	for i := range 20 {
		k := keys.ObjectKey{Chunk: hashOf(byte(i)), Model: "m", Salt: "big"}
		tr.Stored(&k)
		tr.Commit(Commit{Model: "m", Salt: "big", WorldSize: 1, Hashes: []keys.Hash{hashOf(byte(i))}, Tokens: big[:cs],
			Keys: []keys.ObjectKey{k}})
		tr.Commit(Commit{Model: "m", Salt: "big", WorldSize: 1, Hashes: []keys.Hash{hashOf(200)}, Tokens: big,
			Keys: []keys.ObjectKey{{Chunk: hashOf(200), Model: "m", Salt: "big"}}})
		note()
	}
	if most > maxOps {
		t.Errorf("%d ops waited at once, bound %d", most, maxOps)
	}
	if mostTokens > maxOpTokens+len(big) {
		t.Errorf("%d tokens waited at once, bound %d", mostTokens, maxOpTokens+len(big))
	}
	s := tr.Stats()
	if n, _ := tr.waiting(); n != 0 {
		t.Errorf("%d ops wait after Stats", n)
	}
	// Each big salt's chunk i was stored and committed (a prompt's first,
	// announced); hashOf(200) was never stored, so its commits announce
	// nothing; every chunk of the loop was lost.
	if s.Announced != 20 || s.Held != 0 {
		t.Errorf("announced %d, held %d; want 20, 0", s.Announced, s.Held)
	}
}

// TestOpsApplyInCallOrder: calls from many goroutines, each storing,
// committing and losing its own prompts, while readers apply the queue at
// any moment (Stats, Since, the log's Read): each goroutine's calls are
// applied in its order, so every prompt ends removed, and every chunk the
// log announced it also withdrew. The same calls of one key, stored again
// after its loss, end announced.
func TestOpsApplyInCallOrder(t *testing.T) {
	log := NewLog(DefaultLogSize, cs, 1)
	tr := New(Options{BlockSize: cs, Log: log})
	tr.Registered("m", 1, one)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		cursor := uint64(0)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = tr.Stats()
			_ = tr.Since(0)
			cursor = log.Read(cursor, "m", MaxPollEvents).NextCursor
			tr.Flush()
		}
	}()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			salt := string(rune('a' + g))
			for i := range 300 {
				h := hashOf(byte(i))
				k := keys.ObjectKey{Chunk: h, Model: "m", Salt: salt}
				tr.Stored(&k)
				tr.Commit(Commit{Model: "m", Salt: salt, WorldSize: 1, Hashes: []keys.Hash{h}, Tokens: make([]uint32, cs),
					Keys: []keys.ObjectKey{k}})
				tr.Lost(&k)
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	if s := tr.Stats(); s.Announced != 0 || s.Held != 0 || s.StoredEvents != s.RemovedEvents {
		t.Fatalf("after every prompt was lost: %+v", s)
	}
	// One key lost, stored again and committed: announced.
	k := keys.ObjectKey{Chunk: hashOf(1), Model: "m", Salt: "again"}
	c := Commit{Model: "m", Salt: "again", WorldSize: 1, Hashes: []keys.Hash{hashOf(1)}, Tokens: make([]uint32, cs)}
	tr.Stored(&k)
	c.Keys = []keys.ObjectKey{k}
	tr.Commit(c)
	tr.Lost(&k)
	tr.Stored(&k)
	c.Keys = []keys.ObjectKey{k}
	tr.Commit(c)
	if s := tr.Stats(); s.Announced != 1 {
		t.Fatalf("stored again after its loss: announced %d, want 1", s.Announced)
	}
	recs := log.Read(log.Stats().NextSeq-2, "m", MaxPollEvents).Events
	if len(recs) != 1 {
		t.Fatalf("the log's last record: %d records", len(recs))
	}
	if last := recs[0]; !last.Stored || last.Hashes[0] != hashOf(1) {
		t.Fatalf("the log's last record %+v, want hashOf(1) stored", last)
	}
}

// TestCommitTakesItsOwnTokens: a commit's tokens are the request's, which
// the caller reuses once it answered: what is announced is what they were
// at the call.
func TestCommitTakesItsOwnTokens(t *testing.T) {
	log := NewLog(DefaultLogSize, cs, 1)
	tr := New(Options{BlockSize: cs, Log: log})
	tr.Registered("m", 1, one)
	k := keys.ObjectKey{Chunk: hashOf(1), Model: "m"}
	toks := []uint32{7, 7, 7, 7}
	tr.Stored(&k)
	tr.Commit(Commit{Model: "m", WorldSize: 1, Hashes: []keys.Hash{hashOf(1)}, Tokens: toks, Keys: []keys.ObjectKey{k}})
	copy(toks, []uint32{9, 9, 9, 9}) // the request's buffer, reused
	recs := log.Read(0, "m", MaxPollEvents).Events
	if len(recs) != 1 || len(recs[0].Tokens) != cs || recs[0].Tokens[0] != 7 {
		t.Fatalf("log records %+v, want one with tokens 7", recs)
	}
}

// TestHoldNeverWaitsAndKeepsTheOrder: a registration is queued like the
// data path's calls; Hold returns while an applier holds the tracker (it
// is on a restart's gap) and applies nothing itself; the ops queued before
// it are applied by the next applier while held, those after it only at
// Release, so the chunk a registration made usable is announced, and one
// lost after the Hold is still announced until Release.
func TestHoldNeverWaitsAndKeepsTheOrder(t *testing.T) {
	tr := New(Options{BlockSize: cs, NoStream: true, Log: NewLog(DefaultLogSize, cs, 1)})
	ks := make([]keys.ObjectKey, 4)
	for i := range ks {
		ks[i] = keys.ObjectKey{Chunk: hashOf(byte(i)), Model: "m"}
		tr.Stored(&ks[i])
		tr.Commit(Commit{Model: "m", WorldSize: 1, Hashes: []keys.Hash{ks[i].Chunk}, Tokens: make([]uint32, cs),
			Keys: []keys.ObjectKey{ks[i]}})
	}
	tr.Registered("m", 1, one)
	if n, _ := tr.waiting(); n != 9 {
		t.Fatalf("%d ops wait, want the 4 stores, 4 commits and the registration", n)
	}
	tr.mu.Lock() // an applier at work
	done := make(chan struct{})
	go func() {
		tr.Hold()
		close(done)
	}()
	select {
	case <-done: // Hold returned while the tracker was locked
		tr.mu.Unlock()
	case <-time.After(5 * time.Second):
		tr.mu.Unlock()
		<-done
		t.Fatal("Hold waited for the applier")
	}
	tr.Lost(&ks[0])
	if n, _ := tr.waiting(); n != 10 {
		t.Fatalf("%d ops wait after Hold, want 10: Hold applied some", n)
	}
	tr.mu.Lock()
	tr.applyLocked()
	tr.mu.Unlock()
	if n, _ := tr.waiting(); n != 1 {
		t.Fatalf("%d ops wait while held, want only the Lost queued after Hold", n)
	}
	if a := tr.l1.announced; a != 4 {
		t.Fatalf("while held %d chunks announced, want the 4 the registration made usable", a)
	}
	tr.Release()
	if s := tr.Stats(); s.Announced != 3 || s.Queued != 0 {
		t.Fatalf("after Release: %d announced, %d queued; want 3, 0", s.Announced, s.Queued)
	}
}

// TestStatsDoNotWaitForTheReannouncement: while a restart's
// re-announcement holds the tracker (its mutex taken), the tracker's and
// the poll log's Stats answer at once (what /status shows): the last
// figures, the stream counted behind; a read of the log (a poll) still
// waits for the re-announcement; after Release the figures are exact.
func TestStatsDoNotWaitForTheReannouncement(t *testing.T) {
	lg := NewLog(DefaultLogSize, cs, 1)
	tr := New(Options{BlockSize: cs, NoStream: true, Log: lg})
	tr.Registered("m", 1, one)
	k := keys.ObjectKey{Chunk: hashOf(1), Model: "m"}
	tr.Stored(&k)
	tr.Commit(Commit{Model: "m", WorldSize: 1, Hashes: []keys.Hash{k.Chunk}, Tokens: make([]uint32, cs), Keys: []keys.ObjectKey{k}})
	if s := tr.Stats(); s.Announced != 1 {
		t.Fatalf("announced %d, want 1", s.Announced)
	}
	tr.Hold()
	tr.mu.Lock() // the re-announcement at work
	answered := make(chan Stats, 1)
	go func() {
		_ = lg.Stats()
		answered <- tr.Stats()
	}()
	read := make(chan struct{})
	go func() {
		lg.Read(0, "m", 10)
		close(read)
	}()
	select {
	case s := <-answered:
		if s.Announced != 1 || s.Queued < 1 {
			t.Errorf("while held: announced %d, queued %d; want the last figure, 1, and the stream behind", s.Announced, s.Queued)
		}
	case <-time.After(5 * time.Second):
		t.Error("Stats waited for the re-announcement")
	}
	select {
	case <-read:
		t.Error("a poll read the log while the re-announcement held it")
	case <-time.After(50 * time.Millisecond):
	}
	tr.mu.Unlock()
	tr.Release()
	<-read
	if s := tr.Stats(); s.Announced != 1 || s.Queued != 0 {
		t.Fatalf("after Release: announced %d, queued %d; want 1, 0", s.Announced, s.Queued)
	}
}
