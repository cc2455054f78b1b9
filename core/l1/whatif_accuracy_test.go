package l1

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/lookup"
	"kvdock/core/whatif"
)

// The what-if acceptance: generated traces replayed through real pools
// (this package's table, allocator and eviction under each policy, the
// watermark loop ticking as it does once a second) of 0.5×, 1× and 2× a
// pool, driven the way workers drive kvdock (LOOKUP through the real lookup
// module, retrieve, store of the chunks that missed, END_SESSION). The
// estimator watches the 1× pool only; its curve for the pools' policy must
// give each pool's measured hit ratio within 5 percentage points.

// traceReq is one prompt: its model and its chunks' token runs.
type traceReq struct {
	model  int
	chunks [][]uint32
}

// traceModel is one model of a trace: its object size (a layout) decides
// how many bytes each of its chunks takes.
type traceModel struct {
	name string
	size int64
}

const (
	accChunkTokens = 16
	accAlign       = 4096
)

// chunkTokens is the token run of chunk i of document doc: equal
// documents give equal chunks, so their keys match (the chain hash).
func chunkTokens(doc uint64, i int) []uint32 {
	t := make([]uint32, accChunkTokens)
	for j := range t {
		t[j] = uint32(mixTok(doc*1_000_003 + uint64(i)*131 + uint64(j)))
	}
	return t
}

func mixTok(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// zipfTrace is a prefix workload: documents (system prompts, shared
// contexts) of 2 to 24 chunks chosen with Zipf popularity, each followed by
// a unique question of 1 to 3 chunks never asked again; two models with
// objects of different sizes share the pool.
func zipfTrace(n int, seed uint64) []traceReq {
	r := rand.New(rand.NewPCG(seed, 1))
	const docs = 6000
	z := rand.NewZipf(r, 1.1, 4, docs-1)
	out := make([]traceReq, n)
	unique := uint64(1 << 40)
	for i := range out {
		d := z.Uint64()
		m := int(d % 3 % 2) // two thirds on model 0
		doc := d + 1
		l := 2 + int(mixTok(doc)%23)
		var ch [][]uint32
		for c := range l {
			ch = append(ch, chunkTokens(doc, c))
		}
		for range 1 + r.IntN(3) {
			unique++
			ch = append(ch, chunkTokens(unique, 0))
		}
		out[i] = traceReq{model: m, chunks: ch}
	}
	return out
}

// scanTrace is scan-heavy: 70 % of the prompts walk, in order and over and
// over, a set of documents larger than the 1× pool (LRU keeps none of them
// then; the 2× pool keeps them all), the rest hit a small hot set.
func scanTrace(n int, scanDocs int, seed uint64) []traceReq {
	r := rand.New(rand.NewPCG(seed, 2))
	out := make([]traceReq, n)
	next := 0
	const hot = 200
	for i := range out {
		var doc uint64
		if r.Float64() < 0.7 {
			doc = uint64(1_000_000 + next)
			next = (next + 1) % scanDocs
		} else {
			doc = uint64(2_000_000 + r.IntN(hot))
		}
		var ch [][]uint32
		for c := range 8 {
			ch = append(ch, chunkTokens(doc, c))
		}
		out[i] = traceReq{chunks: ch}
	}
	return out
}

// estObserver feeds est what the pool reports, as the engine's observer
// does; losses are for the miss record, not the curve.
type estObserver struct{ *whatif.Estimator }

func (estObserver) Lost(*keys.ObjectKey, int64, Loss) {}

// alwaysLayouts registers every model (the replay has no workers).
type alwaysLayouts struct{}

func (alwaysLayouts) Registered(string, int) ([]uint64, []int) { return []uint64{0}, []int{1} }

// replayResult is what a replay measured over the trace's second half.
type replayResult struct {
	asked, hit  int64         // chunks looked up, chunks hit
	usable, res float64       // sums of usable and resident bytes after each request
	samples     int           // requests summed in usable and res
	evicted     uint64        // objects the watermark loop evicted
	evictTime   time.Duration // time in the watermark loop
	final       Stats         // the pool at the end
	chunkTokens int
	poolBytes   int64
}

func (r replayResult) hitRatio() float64 { return float64(r.hit) / float64(r.asked) }

// replayPolicy drives one pool of poolBytes under policy with trace the way
// workers drive kvdock: LOOKUP through the real lookup module, retrieve of
// the hits, store of the chunks that missed, END_SESSION; the watermark
// loop ticks every tickEvery requests.
func replayPolicy(tb testing.TB, trace []traceReq, models []traceModel, poolBytes int64, tickEvery int, est *whatif.Estimator, policy string) replayResult {
	tb.Helper()
	p, h := replayPool(tb, poolBytes, policy, estObserver{est})
	defer p.Close()
	sess := keys.NewSessions(h, 0, nil)
	mod := lookup.New(sess, p, alwaysLayouts{}, lookup.Options{WhatIf: est})
	owner := InstanceOwner(1)
	out := replayResult{chunkTokens: accChunkTokens, poolBytes: poolBytes}
	tokens := make([]uint32, 0, 32*accChunkTokens)
	for i, rq := range trace {
		if i%tickEvery == 0 {
			before := p.st.Evictions
			start := time.Now()
			p.Maintain() // the watermark loop's tick
			if i >= len(trace)/2 {
				out.evictTime += time.Since(start)
				out.evicted += p.st.Evictions - before
			}
		}
		tokens = tokens[:0]
		for _, c := range rq.chunks {
			tokens = append(tokens, c...)
		}
		m := models[rq.model]
		id := fmt.Sprintf("r%d", i)
		req := keys.KeyRequest{RequestID: id, Tokens: tokens, Model: m.name, WorldSize: 1}
		if err := mod.Lookup(req, 0); err != nil {
			tb.Fatal(err)
		}
		n, done := mod.QueryStatus(id)
		if !done {
			tb.Fatal("lookup without tiers still running")
		}
		ks := keys.ObjectKeys(h.Hashes(tokens), m.name, 1, nil, "")
		p.FinishRead(ks[:n], 1) // the worker retrieved them
		if n < len(ks) {
			// The worker stores the whole prompt: the pool skips what it has.
			res, err := p.ReserveWrite(owner, ks, m.size)
			if err != nil {
				tb.Fatalf("request %d: store: %v", i, err)
			}
			if !p.FinishWrite(res) {
				tb.Fatalf("request %d: store not published", i)
			}
		}
		mod.EndSession(id)
		if i >= len(trace)/2 {
			out.asked += int64(len(ks))
			out.hit += int64(n)
			p.mu.Lock()
			out.usable += float64(p.t.usableBytes)
			out.res += float64(p.t.bytes - p.t.doomedBytes)
			p.mu.Unlock()
			out.samples++
		}
	}
	out.final = p.Stats()
	return out
}

// replayPool opens a replay's pool of size bytes under policy, telling obs
// (nil: nobody), and the hasher of the replays' chunks; the caller closes
// the pool.
func replayPool(tb testing.TB, size int64, policy string, obs Observer) (*Pool, *keys.Hasher) {
	tb.Helper()
	p, err := Open(Options{Size: size, Align: accAlign, Observer: obs, Policy: policy})
	if err != nil {
		tb.Fatal(err)
	}
	h, err := keys.NewHasher(accChunkTokens, keys.AlgorithmBLAKE3)
	if err != nil {
		p.Close()
		tb.Fatal(err)
	}
	return p, h
}

// whatIfCase is one trace the what-if is checked on: the trace, its
// models, the 1× pool and the requests between two ticks of the watermark
// loop.
type whatIfCase struct {
	name   string
	trace  []traceReq
	models []traceModel
	pool   int64
	tick   int
}

// whatIfCases are the traces TestWhatIfMatchesRealPools checks.
func whatIfCases() []whatIfCase {
	// Busy traffic (a tick every 1000 requests) refills what a tick evicts
	// before the next one; slow traffic (20) leaves the pool between 64 %
	// and 80 % full.
	longChat, longLive := longChatTrace(8_000, 8, 8, 100, 6)
	return []whatIfCase{
		{"zipf-prefix", zipfTrace(120_000, 7),
			[]traceModel{{"m-small", 3000}, {"m-large", 3 * accAlign}}, 6000 * accAlign, 1000},
		{"zipf-prefix-slow", zipfTrace(60_000, 8),
			[]traceModel{{"m-small", 3000}, {"m-large", 3 * accAlign}}, 6000 * accAlign, 20},
		// 1200 scanned documents × 8 chunks and the hot set: 11200 objects,
		// against a 1× pool of 9000 (LRU keeps no scanned chunk) and a 2×
		// pool of 18000 that holds them all below its watermark (80 %, 14400).
		// A working set right at a watermark makes the loop evict or not by
		// a few objects, which no sampled estimate can tell.
		{"scan-heavy", scanTrace(60_000, 1200, 11),
			[]traceModel{{"m", accAlign}}, 9000 * accAlign, 1000},
		// Few conversations that each open on a 100-chunk context, a pool
		// of their live set, ticking as BenchmarkEvictionTraces does.
		{"long-context-chat", longChat, []traceModel{{"m", accAlign}}, longLive, 4},
	}
}

// TestWhatIfMatchesRealPools checks each policy's curve against real pools
// of that policy. The long-context chat case is where the two policies part
// (LRU evicts a long prompt's first chunks first and strands the rest; the
// prefix policy evicts it from its last chunk back).
func TestWhatIfMatchesRealPools(t *testing.T) {
	if testing.Short() {
		t.Skip("replays four traces through twelve pools per policy")
	}
	if raceDetector {
		// The replay is one goroutine: the detector has nothing to find in
		// it and would stretch a minute into most of the test timeout. The
		// hooks' concurrency is checked under -race by whatif's
		// TestConcurrentUse and the engine's wire test.
		t.Skip("sequential replay; run without -race")
	}
	cases := whatIfCases()
	for _, pol := range []string{PolicyLRU, PolicyPrefix} {
		for _, tc := range cases {
			t.Run(pol+"/"+tc.name, func(t *testing.T) {
				est := whatif.New(whatif.Served(tc.pool))
				got := map[float64]float64{1: replayPolicy(t, tc.trace, tc.models, tc.pool, tc.tick, est, pol).hitRatio()}
				for _, f := range []float64{0.5, 2} {
					got[f] = replayPolicy(t, tc.trace, tc.models, int64(f*float64(tc.pool)), tc.tick, nil, pol).hitRatio()
				}
				c := est.Curve()
				t.Logf("estimator: rate %.4f, %d/%d tracked, weight %.0f, measured %.3f, %d bytes",
					c.SampleRate, c.Tracked, c.Limit, c.Weight, c.Measured, c.MemoryBytes)
				for i, pt := range c.Points {
					t.Logf("  %.2f× estimated LRU %.3f, prefix %.3f", pt.Factor, pt.HitRatio, c.Prefix[i].HitRatio)
				}
				points := c.Points
				if pol == PolicyPrefix {
					points = c.Prefix
				}
				for _, f := range []float64{0.5, 1, 2} {
					e := pointAt(t, points, f)
					t.Logf("%.1f× pool: measured %.4f, estimated %.4f (%.2f points off)", f, got[f], e, 100*math.Abs(e-got[f]))
					if math.Abs(e-got[f]) > 0.05 {
						t.Errorf("%.1f× pool: estimated hit ratio %.3f, the real pool measured %.3f (more than 5 points apart)", f, e, got[f])
					}
				}
			})
		}
	}
}

func pointAt(tb testing.TB, points []whatif.Point, f float64) float64 {
	tb.Helper()
	for _, p := range points {
		if p.Factor == f {
			return p.HitRatio
		}
	}
	tb.Fatalf("no point at %v× in %+v", f, points)
	return 0
}

// TestWhatIfPlaysThePoolAtRateOne checks the prefix curve's miniature pool
// against the pool it stands for with every key sampled: the estimator
// watches a pool, and its point at 1× is that pool played by the sim. Any
// gap is the sim's mechanics, not sampling. Scan-heavy at 0.5× is where a
// store's new chunks, chained before any is a leaf, take no gap (the pool
// gives each the prior once it is a leaf): playing that as given at the
// store kept whole scanned documents the pool loses (0.244 to its 0.182).
func TestWhatIfPlaysThePoolAtRateOne(t *testing.T) {
	if testing.Short() || raceDetector {
		t.Skip("replays a trace through a pool with every key sampled; run without -short and -race")
	}
	pool := int64(4500 * accAlign)
	est := whatif.New(whatif.Options{PoolBytes: pool, MinSamples: 16384})
	replayPolicy(t, scanTrace(60_000, 1200, 11), []traceModel{{"m", accAlign}}, pool, 1000, est, PolicyPrefix)
	c := est.Curve()
	if c.SampleRate != 1 {
		t.Fatalf("sample rate %.4f, want every key sampled", c.SampleRate)
	}
	got := pointAt(t, c.Prefix, 1)
	t.Logf("pool measured %.3f, its sim %.3f", c.Measured, got)
	if math.Abs(got-c.Measured) > 0.01 {
		t.Errorf("the sim of the pool estimates %.3f, the pool measured %.3f (more than 1 point apart)", got, c.Measured)
	}
}

// TestWhatIfPromptSampling checks prompt sampling (whatif's
// SamplePrompts) where chunk sampling fails at any rate: the prefix pool
// on scan-heavy, with 2,048 samples. A scanned document the pool trims
// keeps its first chunks, which a chunk sampled alone (a leaf of the
// sampled tree at once) does not play; the whole documents of prompt
// sampling do. The prefix curve must give the pools within 5 points at
// 0.5×, 1× and 2×; chunk sampling's, from the same number of samples, is
// logged.
func TestWhatIfPromptSampling(t *testing.T) {
	if testing.Short() || raceDetector {
		t.Skip("replays a trace through four pools; run without -short and -race")
	}
	const samples = 2048
	trace, models, pool := scanTrace(60_000, 1200, 11), []traceModel{{"m", accAlign}}, int64(9000*accAlign)
	got := map[float64]float64{}
	for _, f := range []float64{0.5, 2} {
		got[f] = replayPolicy(t, trace, models, int64(f*float64(pool)), 1000, nil, PolicyPrefix).hitRatio()
	}
	curve := func(prompts bool) whatif.Curve {
		est := whatif.New(whatif.Options{PoolBytes: pool, MinSamples: samples, SamplePrompts: prompts})
		got[1] = replayPolicy(t, trace, models, pool, 1000, est, PolicyPrefix).hitRatio()
		return est.Curve()
	}
	chunks, prompts := curve(false), curve(true)
	t.Logf("prompt sampling: rate %.4f, %d tracked", prompts.SampleRate, prompts.Tracked)
	for _, f := range []float64{0.5, 1, 2} {
		e := pointAt(t, prompts.Prefix, f)
		t.Logf("%.1f× pool: measured %.3f, estimated %.3f sampling prompts, %.3f sampling chunks", f, got[f], e, pointAt(t, chunks.Prefix, f))
		if math.Abs(e-got[f]) > 0.05 {
			t.Errorf("%.1f× pool: prompt sampling estimates %.3f, the real pool measured %.3f (more than 5 points apart)", f, e, got[f])
		}
	}
}

// BenchmarkWhatIfSampling compares chunk and prompt sampling (whatif's
// SamplePrompts) on the traces of TestWhatIfMatchesRealPools with 2,048
// samples: per policy and trace, the worst distance in points between the
// curve of the pools' policy and the pools at 0.5×, 1× and 2× (each point
// logged). Run it with -benchtime 1x; it replays each trace through four
// pools per policy.
func BenchmarkWhatIfSampling(b *testing.B) {
	const samples = 2048
	for _, pol := range []string{PolicyLRU, PolicyPrefix} {
		for _, tc := range whatIfCases() {
			b.Run(pol+"/"+tc.name, func(b *testing.B) {
				for range b.N {
					got := map[float64]float64{}
					for _, f := range []float64{0.5, 2} {
						got[f] = replayPolicy(b, tc.trace, tc.models, int64(f*float64(tc.pool)), tc.tick, nil, pol).hitRatio()
					}
					for _, prompts := range []bool{false, true} {
						est := whatif.New(whatif.Options{PoolBytes: tc.pool, MinSamples: samples, SamplePrompts: prompts})
						got[1] = replayPolicy(b, tc.trace, tc.models, tc.pool, tc.tick, est, pol).hitRatio()
						c := est.Curve()
						points, mode := c.Points, "chunks"
						if pol == PolicyPrefix {
							points = c.Prefix
						}
						if prompts {
							mode = "prompts"
						}
						worst := 0.0
						for _, f := range []float64{0.5, 1, 2} {
							e := pointAt(b, points, f)
							worst = max(worst, math.Abs(e-got[f]))
							b.Logf("sampling %s (rate %.4f): %.1f× pool measured %.3f, estimated %.3f", mode, c.SampleRate, f, got[f], e)
						}
						b.ReportMetric(100*worst, mode+"-worst-pts")
					}
				}
			})
		}
	}
}
