package restart

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
)

// restartLoopTally counts what the workers saw while kvdock restarted
// under them.
type restartLoopTally struct {
	stores, retrieves   atomic.Int64
	unanswered, refused atomic.Int64
	missed, wrong       atomic.Int64
	slowestNs           atomic.Int64
	mu                  sync.Mutex
	first               []string // the first failures, with their time
	lostStores          []lostStore
	start               time.Time
	// missSpans are when the missed retrieves ran, restartSpans when the
	// restarts did (signal sent to server back): a miss within a restart
	// counts with the requests in flight there. Lookups the old process
	// answered are carried to the new one with their hits, so none is
	// expected; a lookup still in its tier phase at the stop is not
	// (docs/RESTART.md).
	missSpans, restartSpans []span
	// falseSpans are when the stores answered false ran: one within a
	// restart had its PREPARE_STORE answered by the old process and its
	// COMMIT_STORE by the new one, which refuses a commit of slots it did
	// not hand out (docs/RESTART.md).
	falseSpans []span
}

// span is a stretch of time.
type span struct{ from, to time.Time }

func (a span) overlaps(b span) bool { return a.from.Before(b.to) && b.from.Before(a.to) }

// straddled counts the missed retrieves and the stores answered false
// that ran while a restart did.
func (c *restartLoopTally) straddled() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int64(0)
	for _, m := range append(append([]span(nil), c.missSpans...), c.falseSpans...) {
		for _, r := range c.restartSpans {
			if m.overlaps(r) {
				n++
				break
			}
		}
	}
	return n
}

func (c *restartLoopTally) fail(n *atomic.Int64, what string, err error) {
	n.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.first) < 40 {
		c.first = append(c.first, fmt.Sprintf("%.3fs %s: %v", time.Since(c.start).Seconds(), what, err))
	}
}

func (c *restartLoopTally) took(d time.Duration) {
	for {
		old := c.slowestNs.Load()
		if int64(d) <= old || c.slowestNs.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

func (c *restartLoopTally) failed() int64 {
	return c.unanswered.Load() + c.refused.Load() + c.missed.Load() + c.wrong.Load()
}

// lostStore is a store whose request went unanswered.
type lostStore struct {
	w   *loopWorker
	seq int
}

// loopWorker is one Go worker of the restart loop and the sequences it
// committed (each of two chunks, seed-stamped).
type loopWorker struct {
	*harness.GoWorker
	mu        sync.Mutex
	committed []int
}

func (w *loopWorker) storeSeq(ctx context.Context, tally *restartLoopTally, seq int) {
	t0 := time.Now()
	r, err := w.Store(ctx, harness.Tokens(seq, 2, w.Chunk), [][]byte{harness.ChunkData(seq, 0, w.ChunkBytes), harness.ChunkData(seq, 1, w.ChunkBytes)}, fmt.Sprint("s", seq))
	tally.took(time.Since(t0))
	tally.stores.Add(1)
	switch {
	case errors.Is(err, client.ErrTimeout):
		tally.fail(&tally.unanswered, fmt.Sprintf("store %d (%s)", seq, w.Mode()), err)
		tally.mu.Lock()
		tally.lostStores = append(tally.lostStores, lostStore{w, seq})
		tally.mu.Unlock()
	case err != nil || r != "true":
		tally.fail(&tally.refused, fmt.Sprintf("store %d (%s) answered %q", seq, w.Mode(), r), err)
		if err == nil {
			tally.mu.Lock()
			tally.falseSpans = append(tally.falseSpans, span{t0, time.Now()})
			tally.mu.Unlock()
		}
	default:
		w.mu.Lock()
		w.committed = append(w.committed, seq)
		w.mu.Unlock()
	}
}

func (w *loopWorker) retrieveSeq(ctx context.Context, tally *restartLoopTally, seq int, req string) {
	t0 := time.Now()
	got, err := w.Retrieve(ctx, harness.Tokens(seq, 2, w.Chunk), 2, req)
	tally.took(time.Since(t0))
	tally.retrieves.Add(1)
	what := fmt.Sprintf("retrieve %d (%s)", seq, w.Mode())
	switch {
	case errors.Is(err, client.ErrTimeout):
		tally.fail(&tally.unanswered, what, err)
	case err != nil:
		tally.fail(&tally.refused, what, err)
	case got == nil:
		tally.fail(&tally.missed, what, errors.New("missed"))
		tally.mu.Lock()
		tally.missSpans = append(tally.missSpans, span{t0, time.Now()})
		tally.mu.Unlock()
	case len(got) != 2 || harness.Sum(got[0]) != harness.Sum(harness.ChunkData(seq, 0, w.ChunkBytes)) || harness.Sum(got[1]) != harness.Sum(harness.ChunkData(seq, 1, w.ChunkBytes)):
		tally.fail(&tally.wrong, what, errors.New("bytes differ"))
	}
}

// Four Go workers (two over SHM, two over pickle, each on its own DEALER
// with a 3 s timeout) store a new sequence and retrieve a committed one in
// turn while kvdock restarts six times, 3.5 s apart, SIGTERM with
// --l1-keep-on-exit then the same command line alternating with SIGUSR2.
// No worker registers again. No request is refused (a store prepared by
// the old process commits in the new one: the handover carries it), no
// committed sequence misses, no byte differs, and at the end every
// committed sequence reads back identical. Unanswered requests are logged
// with each store's fate; at most one a restart is tolerated, for a Go
// worker fast enough to send down the closing connection.
func TestRestartLoopLosesNoRequest(t *testing.T) {
	const nw, restarts = 4, 6
	// Each worker stores at most maxLoopStores sequences, then only
	// retrieves: 4 × 3,000 × 2 chunks of 4 KiB stay under the pool's
	// eviction watermark, so every committed sequence must hit.
	const maxLoopStores = 3000
	// A pool of 256 MiB keeps every sequence the loop stores on a fast
	// machine (~7,000 of 2 chunks of 4 KiB) under the eviction watermark,
	// so the final read may ask for all of them.
	srv := harness.StartKeeping(t, false, "--chunk-size", "16", "--l1-size-gb", "0.25")
	ws := make([]*loopWorker, nw)
	for i := range ws {
		ws[i] = &loopWorker{GoWorker: harness.NewWorker(t, srv.DialWith(t, "nongpu-v1", 3*time.Second), int64(900+i), "restart-loop", i%2 == 1)}
	}
	tally := &restartLoopTally{start: time.Now()}
	ctx := context.Background()
	for i, w := range ws {
		for s := range 4 {
			w.storeSeq(ctx, tally, i*1_000_000+s)
		}
	}
	if tally.failed() != 0 {
		t.Fatalf("stores before the restarts failed: %v", tally.first)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := rand.New(rand.NewPCG(uint64(i), 1))
			for n := 4; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if n < maxLoopStores {
					w.storeSeq(ctx, tally, i*1_000_000+n)
				}
				w.mu.Lock()
				seq := w.committed[g.IntN(len(w.committed))]
				w.mu.Unlock()
				w.retrieveSeq(ctx, tally, seq, fmt.Sprintf("r%d-%d", i, n))
			}
		}()
	}
	var gaps []string
	for r := range restarts {
		time.Sleep(3500 * time.Millisecond)
		var took time.Duration
		from := time.Now()
		if r%2 == 0 {
			took = srv.RestartTerm(t)
		} else {
			took = srv.RestartSignal(t)
		}
		tally.mu.Lock()
		tally.restartSpans = append(tally.restartSpans, span{from, time.Now()})
		tally.mu.Unlock()
		rs := srv.LastRestart(t)
		if !rs.Adopted || rs.AdoptedContexts != nw {
			close(stop)
			wg.Wait()
			t.Fatalf("restart %d: %+v", r, rs)
		}
		gaps = append(gaps, fmt.Sprintf("%v (server gap %.0f ms)", took.Round(time.Millisecond), rs.GapMs))
	}
	// Traffic follows the last restart too: the workers go on until they
	// have finished two calls each after it (30 s only bounds a failure).
	calls := func() int64 { return tally.stores.Load() + tally.retrieves.Load() }
	want := calls() + 2*nw
	for deadline := time.Now().Add(30 * time.Second); calls() < want && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if n := calls() - want + 2*nw; n < 2*nw {
		t.Fatalf("%d calls finished within 30 s of the last restart, want %d", n, 2*nw)
	}
	t.Logf("%d restarts, back after %v; %d stores, %d retrieves: %d unanswered, %d refused, %d missed, %d wrong; slowest call %v",
		restarts, gaps, tally.stores.Load(), tally.retrieves.Load(), tally.unanswered.Load(), tally.refused.Load(),
		tally.missed.Load(), tally.wrong.Load(), time.Duration(tally.slowestNs.Load()).Round(time.Millisecond))
	if tally.wrong.Load() != 0 {
		t.Fatalf("%d wrong chunks across restarts: %v", tally.wrong.Load(), tally.first)
	}
	// A store left unanswered either reached a server (it committed, the
	// reply was lost) or never did: a lookup tells which.
	for _, l := range tally.lostStores {
		n, err := harness.Lookup(ctx, l.w.C, l.w.Model, harness.Tokens(l.seq, 2, l.w.Chunk), fmt.Sprint("lost-", l.seq))
		t.Logf("unanswered store %d (%s): %d of 2 chunks stored afterwards (%v)", l.seq, l.w.Mode(), n, err)
	}
	// The handover answers every request read and carries the transfers
	// its answers began: nothing is refused or missed, across a restart or
	// not. A Go worker that sends within microseconds of an answer can
	// still beat its libzmq to the end of the connection (the old process
	// reads and counts that request); at most one a restart.
	if n := tally.failed() - tally.unanswered.Load(); n != 0 {
		t.Errorf("%d requests refused or missed across %d restarts (%d of them during one): %v", n, restarts, tally.straddled(), tally.first)
	}
	if n := tally.unanswered.Load(); n > restarts {
		t.Errorf("%d requests unanswered across %d restarts: more than one a restart: %v", n, restarts, tally.first)
	} else if n > 0 {
		t.Logf("%d requests unanswered across %d restarts (target 0): %v", n, restarts, tally.first)
	}
	final := &restartLoopTally{start: time.Now()}
	total := 0
	for i, w := range ws {
		for _, seq := range w.committed {
			w.retrieveSeq(ctx, final, seq, fmt.Sprintf("final-%d-%d", i, seq))
			total++
		}
	}
	if final.failed() != 0 {
		t.Fatalf("final read of %d committed sequences: %d failed: %v", total, final.failed(), final.first)
	}
}
