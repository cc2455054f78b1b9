package resp

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"kvdock/core/testkit/redisserver"
)

// TestAbsentAnswerBeforeOwnWriteNotRemembered: an absent answer to a
// question asked before one of our own writes may predate that write; it is
// not remembered, whether it came from a lookup or a background refresh.
func TestAbsentAnswerBeforeOwnWriteNotRemembered(t *testing.T) {
	a := newAbsentKeys()
	q := a.ask()
	a.forget("k") // our write lands while the EXISTS is under way
	a.add("k", q)
	if a.firstFresh([]string{"k"}, time.Now()) == 0 {
		t.Fatal("an answer asked for before our write was remembered")
	}
	a.add("k", a.ask())
	past := time.Now().Add(refreshAfter)
	if absent, refresh := a.knownAbsent("k", past); !absent || !refresh {
		t.Fatalf("past refreshAfter: absent %v, refresh %v; want both", absent, refresh)
	}
	if absent, refresh := a.knownAbsent("k", past); !absent || refresh {
		t.Fatalf("a second refresh started while one is under way (absent %v, refresh %v)", absent, refresh)
	}
	q = a.ask()
	a.forget("k")
	a.add("k", q)
	if absent, _ := a.knownAbsent("k", time.Now()); absent {
		t.Fatal("a refresh asked for before our write brought the key back as absent")
	}
}

// TestAbsentRefreshEndsOnce: a refresh that gets no answer lets the entry
// age out as it would have, and a later lookup may start another.
func TestAbsentRefreshEndsOnce(t *testing.T) {
	a := newAbsentKeys()
	a.add("k", a.ask())
	past := time.Now().Add(refreshAfter)
	if _, refresh := a.knownAbsent("k", past); !refresh {
		t.Fatal("no refresh past refreshAfter")
	}
	a.drop("k")
	if _, refresh := a.knownAbsent("k", past); !refresh {
		t.Fatal("no new refresh after one was dropped")
	}
	if absent, _ := a.knownAbsent("k", time.Now().Add(absentFor)); absent {
		t.Fatal("an answer older than absentFor was trusted")
	}
}

// TestKnownAbsentRefreshedInBackground: a prefix that keeps being looked
// up stays known absent past absentFor (background EXISTS, one at a time
// per key, however many lookups ask at once); another host's write of it
// is still seen within about absentFor.
func TestKnownAbsentRefreshedInBackground(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	if n, err := tr.Has(ctx, []string{"k"}); n != 0 || err != nil {
		t.Fatalf("Has = %d, %v", n, err)
	}
	if _, err := s.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	// Eight lookups at a time, for 8×absentFor.
	const span = 8 * absentFor
	var wg sync.WaitGroup
	var mu sync.Mutex
	probes, known := 0, 0
	end := time.Now().Add(span)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(end) {
				k := tr.KnownAbsent("k")
				mu.Lock()
				probes++
				if k {
					known++
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	// Without the refreshes the answer lapses after absentFor: at most an
	// eighth of the probes would find it.
	if known < probes*3/4 {
		t.Fatalf("known absent at %d of %d probes over %v: the answer was not kept fresh", known, probes, span)
	}
	// One refresh per refreshAfter at most (plus the last one's slack),
	// not one per lookup.
	if got, most := existsCalls(t, s), int(span/refreshAfter)+2; got == 0 || got > most {
		t.Fatalf("%d EXISTS over %v for %d lookups; want 1..%d", got, span, probes, most)
	}
	// Another host writes the key: seen within about absentFor.
	if _, err := s.Do(ctx, "SET", DefaultKeyPrefix+"k", "v"); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	for tr.KnownAbsent("k") {
		if time.Since(written) > 20*absentFor {
			t.Fatalf("another host's write still unseen after %v", time.Since(written))
		}
		time.Sleep(time.Millisecond)
	}
	if n, err := tr.Has(ctx, []string{"k"}); n != 1 || err != nil {
		t.Fatalf("Has after their write = %d, %v; want 1", n, err)
	}
}

// TestCloseEndsAbsentRefresh: Close does not wait out a background refresh
// that a paused server does not answer, and no refresh starts after it.
func TestCloseEndsAbsentRefresh(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	t.Cleanup(func() { _, _ = s.Do(context.Background(), "CLIENT", "UNPAUSE") })
	// The refresh starts only while the answer is between refreshAfter and
	// absentFor old; a loaded machine may overshoot that window, so ask
	// again rather than give up.
	for attempt := 1; ; attempt++ {
		if n, err := tr.Has(ctx, []string{"k"}); n != 0 || err != nil {
			t.Fatalf("Has = %d, %v", n, err)
		}
		time.Sleep(refreshAfter)
		if _, err := s.Do(ctx, "CLIENT", "PAUSE", "8000", "ALL"); err != nil {
			t.Fatal(err)
		}
		if tr.KnownAbsent("k") {
			break
		}
		if _, err := s.Do(ctx, "CLIENT", "UNPAUSE"); err != nil {
			t.Fatal(err)
		}
		if attempt == 20 {
			t.Fatalf("the answer aged out before a refresh could start, %d times", attempt)
		}
	}
	start := time.Now()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close took %v", time.Since(start))
	if took := time.Since(start); took > 6*time.Second {
		t.Fatalf("Close took %v: it waited for the paused server", took)
	}
	if tr.KnownAbsent("k") {
		// Remembered still, but nothing may be asked of a closed tier.
		if _, _, ok := tr.beginNow(true); ok {
			t.Fatal("a closed tier hands out a worker slot")
		}
	}
}

// TestAbsentRefreshesLeaveSlotsForLookups: however many remembered answers
// come due at once, on a server that does not answer, the background
// refreshes hold fewer than half of the small calls' worker slots, so a
// lookup that must ask the server still gets one.
func TestAbsentRefreshesLeaveSlotsForLookups(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	cfg := standaloneCfg(s)
	cfg.NumWorkers = 4
	tr, _ := open(t, cfg)
	ctx := context.Background()
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		if n, err := tr.Has(ctx, keys[i:i+1]); n != 0 || err != nil {
			t.Fatalf("Has(%s) = %d, %v", keys[i], n, err)
		}
	}
	time.Sleep(refreshAfter)
	if _, err := s.Do(ctx, "CLIENT", "PAUSE", "5000", "ALL"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.Do(context.Background(), "CLIENT", "UNPAUSE") })
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Go(func() { tr.KnownAbsent(k) })
	}
	wg.Wait()
	if got := tr.refreshing.Load(); got > int32(cfg.NumWorkers/2) {
		t.Fatalf("%d refreshes under way, want at most %d", got, cfg.NumWorkers/2)
	}
	_, release, ok := tr.beginNow(true)
	if !ok {
		t.Fatal("no small-call slot left for a lookup while refreshes wait on the server")
	}
	release()
}
