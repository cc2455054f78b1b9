package lookup

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/testkit/fakeclock"
)

// TestAnswersCarryToTheNextModule: what one module answered and nobody
// queried yet is restored in another (a restart's successor), which then
// answers the query with the same hits, once, and lets the job age from
// when the first module made it.
func TestAnswersCarryToTheNextModule(t *testing.T) {
	h, err := keys.NewHasher(cs, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	clk := fakeclock.New()
	store := newStore()
	old := New(keys.NewSessions(h, 0, clk.Now), store, allLayouts{}, Options{Now: clk.Now, JobTTL: time.Minute})
	ts := tokens(3 * cs)
	for _, k := range keysOf(t, ts, 1)[:2] {
		store.present[k] = true
	}
	for _, id := range []string{"queried", "waiting"} {
		if err := old.Lookup(lookupReq(id, ts, 1), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n, done := old.QueryStatus("queried"); n != 2 || !done {
		t.Fatalf("query before the restart: %d, %v", n, done)
	}
	as := old.Answers()
	if len(as) != 1 || as[0].RequestID != "waiting" || as[0].HitChunks != 2 {
		t.Fatalf("answers %+v, want the one unqueried job with 2 hits", as)
	}

	clk.Advance(40 * time.Second)
	next := New(keys.NewSessions(h, 0, clk.Now), newStore(), allLayouts{}, Options{Now: clk.Now, JobTTL: time.Minute})
	if n, err := next.Restore(as); n != 1 || err != nil {
		t.Fatalf("restore: %d, %v", n, err)
	}
	if n, done := next.QueryStatus("waiting"); n != 2 || !done {
		t.Fatalf("query after the restart: %d, %v; want the 2 hits found before it", n, done)
	}
	if n, _ := next.QueryStatus("waiting"); n != 0 {
		t.Fatalf("second query: %d, want 0 (a query removes the job)", n)
	}
	// The job keeps its age: 40 s old when restored, gone 20 s later.
	if n, _ := next.Restore(as); n != 1 {
		t.Fatal("restore again")
	}
	clk.Advance(21 * time.Second)
	if n, _ := next.QueryStatus("waiting"); n != 0 {
		t.Fatalf("a job past its TTL answered %d", n)
	}
}

// TestHostileRestoreRefusesBadAnswers: answers are outside input (they
// come from a file); invalid ones are refused with the reason, the valid
// ones restored, and the table's bounds hold.
func TestHostileRestoreRefusesBadAnswers(t *testing.T) {
	h, err := keys.NewHasher(cs, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	clk := fakeclock.New()
	m := New(keys.NewSessions(h, 0, clk.Now), newStore(), allLayouts{}, Options{Now: clk.Now, MaxJobs: 3})
	past := clk.Now().Add(-time.Second)
	as := []Answer{
		{RequestID: strings.Repeat("x", keys.MaxRequestIDLen+1), HitChunks: 1, Created: past},
		{RequestID: "neg", HitChunks: -1, Created: past},
		{RequestID: "future", HitChunks: 1, Created: clk.Now().Add(time.Hour)},
		{RequestID: "zero", HitChunks: 1},
	}
	for i := range 5 {
		as = append(as, Answer{RequestID: "ok" + string(rune('a'+i)), HitChunks: i, Created: past.Add(time.Duration(i) * time.Millisecond)})
	}
	n, err := m.Restore(as)
	if err == nil || !strings.Contains(err.Error(), "answer 1") || !strings.Contains(err.Error(), "answer 2") {
		t.Fatalf("restore of bad answers: %v", err)
	}
	if n != 5 || m.Stats().ActiveJobs != 3 {
		t.Fatalf("restored %d, %d jobs kept; want 5 restored and the newest 3 kept (MaxJobs)", n, m.Stats().ActiveJobs)
	}
	if got, _ := m.QueryStatus("oke"); got != 4 {
		t.Fatalf("the newest restored job answered %d, want 4", got)
	}
	if got, _ := m.QueryStatus("oka"); got != 0 {
		t.Fatalf("the oldest, pushed out by MaxJobs, answered %d", got)
	}
}

// TestHostileRestoreNewestFirstIsNotQuadratic: a record's answers in the
// worst order (newest first) are restored in O(n log n): 65,536 of them
// (the record's bound) within 2 s on a busy machine, where inserting each
// behind the last older one walked the whole table (32 s measured), and
// the table ends oldest first, so MaxJobs pushes out the oldest.
func TestHostileRestoreNewestFirstIsNotQuadratic(t *testing.T) {
	h, err := keys.NewHasher(cs, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	clk := fakeclock.New()
	const n = 65536
	m := New(keys.NewSessions(h, 0, clk.Now), newStore(), allLayouts{}, Options{Now: clk.Now, MaxJobs: n - 1, MaxJobBytes: 1 << 30})
	as := make([]Answer, n)
	for i := range as {
		// as[0] is the newest.
		as[i] = Answer{RequestID: fmt.Sprint("r", i), HitChunks: i + 1, Created: clk.Now().Add(-time.Duration(i+1) * time.Millisecond)}
	}
	start := time.Now()
	got, err := m.Restore(as)
	took := time.Since(start)
	if err != nil || got != n {
		t.Fatalf("restored %d, %v", got, err)
	}
	if took > 2*time.Second {
		t.Fatalf("restoring %d answers newest first took %v", n, took)
	}
	if hits, _ := m.QueryStatus(fmt.Sprint("r", n-1)); hits != 0 {
		t.Fatalf("the oldest answer survived MaxJobs (%d hits)", hits)
	}
	if hits, _ := m.QueryStatus("r0"); hits != 1 {
		t.Fatalf("the newest answer: %d hits, want 1", hits)
	}
	t.Logf("%d answers newest first restored in %v", n, took)
}
