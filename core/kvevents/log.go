package kvevents

import (
	"sync"

	"kvdock/core/keys"
)

// DefaultLogSize is how many records the poll log keeps (LMCache's
// --kv-event-log-size default).
const DefaultLogSize = 32768

// Capability is the name GET_EXPERIMENTAL advertises the poll channel by.
const Capability = "kv_events"

// MaxPollEvents caps the records one poll returns, whatever max_events
// asks: a reply's size is bounded by it (LMCache's poller asks 1024).
const MaxPollEvents = 4096

// MaxRemovedPerRecord caps the hashes one removed record carries, so a
// record's size is bounded whatever an eviction pass removes.
const MaxRemovedPerRecord = 64

// Record is one record of the poll log: a chunk announced (Stored, one
// hash, its parent and tokens) or chunks withdrawn, in one medium.
type Record struct {
	Seq       uint64
	Stored    bool
	Medium    string
	Model     string
	Hashes    []keys.Hash
	Parent    keys.Hash
	HasParent bool
	// Tokens are the stored chunk's tokens (shared with the tracker's
	// node: neither side writes them).
	Tokens []uint32
}

// Poll is the answer to one read of the log.
type Poll struct {
	Incarnation int64
	NextCursor  uint64
	Lost        bool
	Events      []Record
}

// LogStats are the log's figures.
type LogStats struct {
	Capacity    int
	Depth       int    // records kept now
	Bytes       int    // what they hold: tokens and hashes (at most MaxLogBytes)
	NextSeq     uint64 // seq of the next record
	Trimmed     uint64 // records let go, oldest first, past the capacity or MaxLogBytes (a slow poller's loss)
	Polls       uint64
	LostAnswers uint64 // polls answered lost=true
	Incarnation int64
}

type lkey struct {
	medium, model string
	h             keys.Hash
}

// Log is LMCache's KV event channel (POLL_KV_EVENTS): the tracker's
// chunk-level decisions, the same announced set the PUB stream carries, as
// a bounded log of records numbered from 1 that a poller reads after a
// cursor it holds. Hashes are the 32-byte chunk hashes, whatever
// --kv-events-block-size splits the stream into. A chunk held under two
// salts is one router block: it is announced with the first and withdrawn
// with the last. Memory: Capacity records, each one chunk's tokens or at
// most MaxRemovedPerRecord hashes, plus one count per announced chunk.
type Log struct {
	mu          sync.Mutex
	capacity    int
	blockSize   int
	incarnation int64
	ring        fifo[Record] // capacity records, MaxLogBytes of them
	bytes       int          // what ring's records hold (recordBytes)
	nextSeq     uint64       // from 1
	read        uint64       // highest cursor a poll handed out: records up to it never change
	refs        map[lkey]int
	st          LogStats
	// sync applies what the data path told the tracker that feeds the
	// log (Tracker.Sync), so that a read sees every call made before it;
	// nil when no tracker feeds it. Called without mu: the tracker takes
	// its own mutex, then mu.
	sync func()
	// peek is sync for Stats, which never waits for a restart's
	// re-announcement (Tracker.SyncUnlessHeld).
	peek func()
}

// NewLog returns a log of capacity records (> 0) of chunks of blockSize
// tokens, stamped with incarnation, which must differ from every earlier
// log a poller may have read: a poller that sees another incarnation
// forgets what it learned.
func NewLog(capacity, blockSize int, incarnation int64) *Log {
	return &Log{capacity: capacity, blockSize: blockSize, incarnation: incarnation, nextSeq: 1, refs: map[lkey]int{}}
}

// BlockSize is the tokens of one chunk (the records' block_size).
func (l *Log) BlockSize() int { return l.blockSize }

// announced notes a chunk entering the announced set of medium.
func (l *Log) announced(medium, model string, h, parent keys.Hash, hasParent bool, tokens []uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := lkey{medium, model, h}
	l.refs[k]++
	if l.refs[k] > 1 {
		return
	}
	l.append(Record{Stored: true, Medium: medium, Model: model, Hashes: []keys.Hash{h}, Parent: parent,
		HasParent: hasParent, Tokens: tokens})
}

// withdrawn notes a chunk leaving the announced set of medium.
func (l *Log) withdrawn(medium, model string, h keys.Hash) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := lkey{medium, model, h}
	n, ok := l.refs[k]
	if !ok {
		return
	}
	if n > 1 {
		l.refs[k] = n - 1
		return
	}
	delete(l.refs, k)
	// Extend the newest record when it is a removal of the same model and
	// medium no poll has handed out yet, so one eviction pass takes few
	// records.
	if l.ring.len() > 0 {
		last := l.ring.at(l.ring.len() - 1)
		if !last.Stored && last.Seq > l.read && last.Model == model && last.Medium == medium &&
			len(last.Hashes) < MaxRemovedPerRecord {
			last.Hashes = append(last.Hashes, h)
			l.bytes += len(h)
			l.trim()
			return
		}
	}
	l.append(Record{Medium: medium, Model: model, Hashes: []keys.Hash{h}})
}

// MaxLogBytes bounds what the log's records hold (their tokens and
// hashes, recordBytes), whatever its capacity: a record keeps its chunk's
// tokens after the chunk itself is gone, and capacity records of long
// chunks would hold hundreds of MiB. The oldest records leave first, as
// past the capacity; a poller behind them is answered lost.
const MaxLogBytes = 64 << 20

// recordBytes is what a record holds: its tokens and its hashes.
func recordBytes(r *Record) int { return 4*len(r.Tokens) + len(keys.Hash{})*len(r.Hashes) }

func (l *Log) append(r Record) {
	r.Seq = l.nextSeq
	l.nextSeq++
	l.ring.push(r)
	l.bytes += recordBytes(&r)
	l.trim()
}

// trim lets the oldest records go past the capacity or MaxLogBytes (the
// newest is kept).
func (l *Log) trim() {
	for l.ring.len() > 1 && (l.ring.len() > l.capacity || l.bytes > MaxLogBytes) {
		r := l.ring.pop()
		l.bytes -= recordBytes(&r)
		l.st.Trimmed++
	}
}

// Read returns the records of model after cursor (the seq of the last
// record the poller consumed, 0 at first contact), at most max of them
// (clipped to 1..MaxPollEvents), by LMCache's rules: records of other
// models advance the cursor; lost is true when records after cursor were
// overwritten (cursor older than the oldest kept) or when cursor was
// never issued by this log (beyond the newest), which answers no records
// and the newest seq as the next cursor. A read changes nothing a later
// read sees.
func (l *Log) Read(cursor uint64, model string, max int) Poll {
	max = min(MaxPollEvents, max)
	if max < 1 {
		max = 1
	}
	l.synced()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st.Polls++
	p := l.read1(cursor, model, max)
	if p.Lost {
		l.st.LostAnswers++
	}
	if p.NextCursor > l.read {
		l.read = p.NextCursor
	}
	return p
}

func (l *Log) read1(cursor uint64, model string, max int) Poll {
	last := l.nextSeq - 1
	p := Poll{Incarnation: l.incarnation, NextCursor: last}
	if l.ring.len() == 0 || cursor > last {
		p.Lost = cursor > last
		return p
	}
	first := l.ring.at(0).Seq
	p.Lost = cursor+1 < first
	start := uint64(0)
	if cursor+1 > first {
		start = cursor + 1 - first // seqs are consecutive
	}
	p.NextCursor = cursor
	for i := int(start); i < l.ring.len(); i++ {
		r := *l.ring.at(i)
		p.NextCursor = r.Seq
		if r.Model != model {
			continue
		}
		p.Events = append(p.Events, r)
		if len(p.Events) >= max {
			break
		}
	}
	return p
}

// next is the seq the next record gets.
func (l *Log) next() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nextSeq
}

// continueFrom numbers the log's records from next on, when it holds none
// yet and next is past its own numbering: a log that carries on an
// adopted pool's under a new incarnation.
func (l *Log) continueFrom(next uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ring.len() == 0 && next > l.nextSeq {
		l.nextSeq = next
	}
}

// Stats returns the log's figures.
func (l *Log) Stats() LogStats {
	l.callHook(&l.peek)
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.st
	s.Capacity, s.Depth, s.Bytes, s.NextSeq, s.Incarnation = l.capacity, l.ring.len(), l.bytes, l.nextSeq, l.incarnation
	return s
}

// synced brings the log up to every call its tracker was told.
func (l *Log) synced() { l.callHook(&l.sync) }

// callHook calls the tracker's hook *f, if set, without mu (the tracker
// takes its own mutex, then mu).
func (l *Log) callHook(f *func()) {
	l.mu.Lock()
	g := *f
	l.mu.Unlock()
	if g != nil {
		g()
	}
}

// logAnnounced tells the log that e entered the announced set.
func (t *Tracker) logAnnounced(m *medium, e ekey, n *node) {
	if t.opt.Log != nil {
		t.opt.Log.announced(m.name, e.model, e.h, n.parent, n.hasParent, n.tokens)
	}
}

// logWithdrawn tells the log that e left the announced set.
func (t *Tracker) logWithdrawn(m *medium, e ekey) {
	if t.opt.Log != nil {
		t.opt.Log.withdrawn(m.name, e.model, e.h)
	}
}
