package reliability

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
)

// storeLong stores the first n chunks of toks through w, in steps that stay
// under one owner's write-lock cap (a step reserves only the new chunks).
func storeLong(t *testing.T, w *harness.GoWorker, seed int, toks []uint32, n, step int, req string) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	data := attackkit.SeqData(seed, n, w.ChunkBytes)
	for end := step; ; end += step {
		end = min(end, n)
		if res, err := w.Store(ctx, toks, data[:end], fmt.Sprintf("%s-%d", req, end)); err != nil || (res != "true" && res != "none") {
			t.Fatalf("store %d chunks: %q %v", end, res, err)
		}
		if end == n {
			return data
		}
	}
}

// TestHostileLookupLookahead: a scheduler that looks several prompts up
// before retrieving any of them holds read locks on all of them at once. On
// 31a00e7 every LOOKUP shared one owner capped at half the pool, so the
// ninth prompt of ten (62.5% of the pool together) got no hits. Each
// request is now its own owner, capped at half the pool, with all of them
// under the total cap; a single lookup past its cap is refused and its
// refused chunks are counted as `refused`, not `after_miss`.
func TestHostileLookupLookahead(t *testing.T) {
	srv := attackkit.StartAttacked(t)
	ctx := context.Background()
	w := harness.NewWorker(t, srv.Dial(t, srv.Protocol), 41_001, "ahead", false)
	if w.Shm == nil {
		t.Fatal("the server advertises no segment")
	}
	poolChunks := int(w.PoolSize) / w.ChunkBytes
	perPrompt := poolChunks / 16 // ten prompts: 62.5% of the pool
	prompts := make([][]uint32, 10)
	for i := range prompts {
		prompts[i] = harness.Tokens(41_100+i, perPrompt, w.Chunk)
		storeLong(t, w, 41_100+i, prompts[i], perPrompt, perPrompt, fmt.Sprintf("ahead-s%d", i))
	}
	sched := srv.Dial(t, srv.Protocol)
	hits := make([]int, len(prompts))
	short := 0
	for i, toks := range prompts {
		n, err := harness.LookupKeep(ctx, sched, w.Model, toks, fmt.Sprintf("ahead-l%d", i))
		if err != nil {
			t.Fatalf("lookup %d: %v", i, err)
		}
		hits[i] = n
		if n < perPrompt {
			short++
		}
	}
	t.Logf("ten prompts of %d chunks each (pool %d chunks) looked up ahead: hits %v", perPrompt, poolChunks, hits)
	if short > 0 {
		t.Errorf("%d of 10 prompts looked up ahead got fewer than their %d stored chunks: %v", short, perPrompt, hits)
	}
	attackkit.Alive(t, srv, time.Second, "lookups ahead")

	// One lookup past one owner's cap (half the pool) is refused there; a
	// fresh server, since the lookups above hold their locks until their
	// retrieves or the read TTL.
	srv = attackkit.StartAttacked(t)
	w = harness.NewWorker(t, srv.Dial(t, srv.Protocol), 41_002, "ahead", false)
	sched = srv.Dial(t, srv.Protocol)
	long := poolChunks * 5 / 8
	toks := harness.Tokens(41_900, long, w.Chunk)
	storeLong(t, w, 41_900, toks, long, poolChunks/4, "ahead-long")
	before := srv.Status(t).Misses.Missed["refused"]
	n, err := harness.Lookup(ctx, sched, w.Model, toks, "ahead-long-l")
	if err != nil {
		t.Fatal(err)
	}
	st := srv.Status(t)
	refused := st.Misses.Missed["refused"] - before
	t.Logf("one lookup of %d chunks: %d hits, %d counted refused, misses %v", long, n, refused, st.Misses.Missed)
	if n >= long || n < poolChunks/2-1 {
		t.Errorf("a single lookup of %d chunks hit %d: want its cap, about %d", long, n, poolChunks/2)
	}
	if refused != uint64(long-n) {
		t.Errorf("%d chunks refused by the lock cap, %d counted as refused (misses %v)", long-n, refused, st.Misses.Missed)
	}
	// The operator sees it as it happens: a "refused" event in the Events
	// pane and /status.
	seen := false
	for _, ev := range st.Events {
		seen = seen || (ev.Kind == "refused" && strings.Contains(ev.Message, "count as refused"))
	}
	if !seen {
		t.Errorf("no refused event among %+v", st.Events)
	}
	attackkit.Alive(t, srv, time.Second, "lookups ahead")
}

// TestHostileLookupHogCannotStarveAnotherScheduler: one scheduler keeps 69 %
// of the pool looked up (two requests, under one owner's cap each, looked
// up again and again), just under the lookups' cap of 70 %. Another
// scheduler, on its own connection, looks up a prompt of 48 stored chunks:
// every chunk hits, the hog's oldest read locks making room (the lookups'
// cap is shared between the peers holding lookup locks), and lookups
// together stay under the cap.
func TestHostileLookupHogCannotStarveAnotherScheduler(t *testing.T) {
	srv := attackkit.StartAttacked(t)
	ctx := context.Background()
	hw := harness.NewWorker(t, srv.Dial(t, srv.Protocol), 42_001, "hog", false)
	poolChunks := int(hw.PoolSize) / hw.ChunkBytes
	half := poolChunks * 69 / 200 // two prompts: 69 % of the pool
	hogPrompts := [][]uint32{harness.Tokens(42_100, half, hw.Chunk), harness.Tokens(42_101, half, hw.Chunk)}
	for i, toks := range hogPrompts {
		storeLong(t, hw, 42_100+i, toks, half, poolChunks/4, fmt.Sprintf("hog-s%d", i))
	}
	hog := srv.Dial(t, srv.Protocol)
	hogLookups := func() int {
		n := 0
		for i, toks := range hogPrompts {
			h, err := harness.LookupKeep(ctx, hog, hw.Model, toks, fmt.Sprintf("hog-l%d", i))
			if err != nil {
				t.Errorf("hog lookup: %v", err)
			}
			n += h
		}
		return n
	}
	if n := hogLookups(); n != 2*half {
		t.Fatalf("the hog alone: %d of %d chunks looked up", n, 2*half)
	}
	const victimChunks = 48
	vw := harness.NewWorker(t, srv.Dial(t, srv.Protocol), 42_002, "hog-victim", false)
	vt := harness.Tokens(42_200, victimChunks, vw.Chunk)
	storeLong(t, vw, 42_200, vt, victimChunks, victimChunks, "hog-vs")
	victim := srv.Dial(t, srv.Protocol)
	// The hog looks up again while the victim does, throughout.
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		rounds := 0
		for {
			select {
			case <-stop:
				done <- rounds
				return
			default:
			}
			hogLookups()
			rounds++
		}
	}()
	short := 0
	var hits []int
	for r := range 5 {
		n, err := harness.Lookup(ctx, victim, vw.Model, vt, fmt.Sprintf("hog-vl%d", r))
		if err != nil {
			t.Fatalf("victim lookup %d: %v", r, err)
		}
		hits = append(hits, n)
		if n < victimChunks {
			short++
		}
	}
	close(stop)
	rounds := <-done
	st := srv.Status(t).Pool
	t.Logf("hog holds %d chunks looked up (pool %d); victim's 5 lookups of %d chunks hit %v while the hog looked up %d times again; %d bytes locked of %d",
		2*half, poolChunks, victimChunks, hits, rounds, st.LockedBytes, st.CapacityBytes)
	if short > 0 {
		t.Errorf("%d of 5 victim lookups got fewer than their %d stored chunks: %v", short, victimChunks, hits)
	}
	if limit := st.CapacityBytes * 7 / 10; st.LockedBytes > limit {
		t.Errorf("%d bytes locked, past the lookups' cap of %d", st.LockedBytes, limit)
	}
	attackkit.Alive(t, srv, time.Second, "a lookup hog")
}
