package engine

import (
	"math"
	"sync"
	"time"

	"kvdock/core/lookup"
	"kvdock/core/rpc"
	"kvdock/core/series"
	"kvdock/core/workers"
)

// Rates is the recent history of the engine's rates for the faces: one
// point a second (Fine) and, for the server, one every ten seconds (Coarse,
// two hours). Rates are per second; PoolUsed is a level in bytes.
type Rates struct {
	// Taken is when the newest point was sampled (zero before the first).
	Taken    time.Time
	Server   ServerRates
	Contexts map[int64]ContextRates  // by instance id
	Latency  map[string]LatencyRates // by request wire name
}

// ServerRates are the whole server's histories.
type ServerRates struct {
	Lookups       series.Window // LOOKUPs with at least one full chunk
	AskedChunks   series.Window // chunks those lookups asked for
	HitChunks     series.Window // chunks they found in L1
	StoreBytes    series.Window // KV bytes stored by workers
	RetrieveBytes series.Window // KV bytes served to workers
	Evictions     series.Window
	PoolUsed      series.Window // bytes in use
	TokensSaved   series.Window // prefill tokens served from cache
	// TokensSavedTotal is the prefill tokens served from cache since the
	// engine started (pool rebuilds included); TokensSavedHour those of the
	// last hour.
	TokensSavedTotal int64
	TokensSavedHour  float64
}

// ContextRates are one registered instance's histories. The lookup figures
// are those of its worker group (model and world size): the scheduler's
// LOOKUPs name a group, not an instance.
type ContextRates struct {
	Lookups, AskedChunks, HitChunks, TokensSaved series.Window
	StoreBytes, RetrieveBytes                    series.Window
	TokensSavedTotal                             int64
	TokensSavedHour                              float64
}

// LatencyRates are one request kind's requests per second and the p50 and
// p99 of each second, in seconds (0 for a second without requests).
type LatencyRates struct {
	Rate, P50, P99 series.Window
}

// The points a snapshot copies: the server's whole fine and coarse rings;
// for contexts and request kinds the last two minutes (a snapshot is taken
// every second by every face, and there may be a thousand contexts).
const (
	snapServerFine   = series.FineLen
	snapServerCoarse = series.CoarseLen
	snapContextFine  = 120
	snapLatencyFine  = 120
)

// Per-context histories are shorter than the server's (1 s × 5 min and
// 10 s × 1 h): with max_instances contexts at ~32 KiB each the bound stays
// at 32 MiB for the default 1024.
const (
	ctxFineLen   = 300
	ctxCoarseLen = 360
)

// rates samples the engine's counters once a second into histories. Its
// memory is fixed per server, per context seen (dropped when the context
// goes) and per request kind of the profile.
type rates struct {
	// sampleMu makes a reading of the counters and its push into the
	// histories one step, which a reset of the statistics does not split;
	// it also guards marks.
	sampleMu sync.Mutex
	marks    []whatifMark
	// told is when each unregistered model was last told as an event.
	told map[unregisteredKey]time.Time

	mu    sync.Mutex
	taken time.Time
	// resetAt is the last reset of the statistics (zero when none).
	resetAt time.Time
	// Carried figures (carry.go): since is when a predecessor's figures
	// began (zero: none carried, they begin with this engine), carried when
	// this process took them over, poolSince when a new pool began under
	// carried figures (the miss breakdown starts there).
	since, carried, poolSince time.Time

	lookups, asked, hit, tokens counterHistory
	evictions                   counterHistory
	storeB, retrieveB           series.History
	used                        series.History
	tokensTotal                 int64

	ctx    map[int64]*ctxRates
	groups map[groupKey]*groupCounters
	deltas map[groupKey]groupDelta // scratch of add, kept to allocate nothing per sample

	// lat holds a histogram per request kind, fed by the wire server's
	// observer; the keys are fixed per profile (observe only reads the map).
	latMu sync.RWMutex
	lat   map[string]*latencyKind
}

type counterHistory struct {
	c series.Counter
	h series.History
}

func (c *counterHistory) push(v float64, elapsed time.Duration, steps int) float64 {
	d := c.c.Delta(v)
	pushN(&c.h, per(d, elapsed), steps)
	return d
}

// per is d per second over elapsed (0 for no time).
func per(d float64, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return d / elapsed.Seconds()
}

// pushN pushes v steps times: a sample that covers several seconds fills
// each of them, so a chart's time axis and a total over an hour stay right.
func pushN(h *series.History, v float64, steps int) {
	for range steps {
		h.Push(v)
	}
}

// maxSteps bounds the points one late sample fills: the coarse span.
const maxSteps = series.CoarseLen * int(series.CoarseStep/series.FineStep)

type ctxRates struct {
	model                    string
	worldSize                int
	lookups, asked, hit, tok series.History // of its group
	storeB, retrieveB        series.History
	in, out                  series.Counter
	tokensTotal              int64
	seen                     bool // present in the latest sample
}

type groupKey struct {
	model string
	ws    int
}

// groupCounters turn a worker group's cumulative lookup counters into
// per-sample deltas.
type groupCounters struct {
	lookups, asked, hit, tokens series.Counter
}

type groupDelta struct{ lookups, asked, hit, tokens float64 }

type latencyKind struct {
	h       series.Latency
	q       *series.Quantiles
	sampled bool
}

func newRates() *rates {
	h := series.NewHistory
	return &rates{
		lookups: counterHistory{h: h()}, asked: counterHistory{h: h()}, hit: counterHistory{h: h()},
		tokens: counterHistory{h: h()}, evictions: counterHistory{h: h()},
		storeB: h(), retrieveB: h(), used: h(),
		ctx:    map[int64]*ctxRates{},
		groups: map[groupKey]*groupCounters{},
		deltas: map[groupKey]groupDelta{},
		lat:    map[string]*latencyKind{},
	}
}

// countFromZero makes the next reading of the server's counters count all
// of them, for an engine whose counters start at zero (New; a process that
// took its predecessor's figures over): lookups served before the first
// sample are rated, not taken as the base.
func (r *rates) countFromZero() {
	for _, c := range []*counterHistory{&r.lookups, &r.asked, &r.hit, &r.tokens, &r.evictions} {
		c.c = series.Counter{}
		c.c.Delta(0)
	}
}

// kinds makes sure every request kind of a profile has a histogram.
func (r *rates) kinds(names []string) {
	r.latMu.Lock()
	for _, n := range names {
		if r.lat[n] == nil {
			r.lat[n] = &latencyKind{q: series.NewQuantiles()}
		}
	}
	r.latMu.Unlock()
}

// observer feeds the latency histograms and passes every call on to next.
type observer struct {
	r    *rates
	next rpc.Observer
}

func (o observer) OnRequest(name, outcome string, dur time.Duration) {
	o.r.latMu.RLock()
	k := o.r.lat[name]
	o.r.latMu.RUnlock()
	if k != nil {
		k.h.Observe(dur)
	}
	if o.next != nil {
		o.next.OnRequest(name, outcome, dur)
	}
}

// sample is what one reading of the engine's counters found.
type sample struct {
	now             time.Time
	lookup          lookup.Stats
	groups          []lookup.ModelStats
	contexts        []workers.ContextInfo
	evictions, used float64
}

// add pushes the points of every history from s: one per second since the
// previous sample (a stalled sampler or a suspended process fills the gap
// with the mean rate), at least one.
func (r *rates) add(s sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	elapsed := time.Duration(0)
	if !r.taken.IsZero() {
		elapsed = s.now.Sub(r.taken)
		if elapsed <= 0 {
			return // no time passed (a clock step back): nothing to rate
		}
	}
	r.taken = s.now
	steps := min(maxSteps, max(1, int(math.Round(elapsed.Seconds()))))
	// Rates are per point (one a second): a sample 1.02 s after the last
	// spreads its increase over one point, so the totals over an hour are
	// the counters' own increase, not off by the ticker's jitter.
	elapsed = time.Duration(steps) * series.FineStep

	r.lookups.push(float64(s.lookup.Lookups), elapsed, steps)
	r.asked.push(float64(s.lookup.RequestedChunks), elapsed, steps)
	r.hit.push(float64(s.lookup.HitChunks), elapsed, steps)
	r.tokensTotal += int64(r.tokens.push(float64(s.lookup.HitTokens), elapsed, steps))
	r.evictions.push(s.evictions, elapsed, steps)
	pushN(&r.used, s.used, steps)
	// Group figures: the deltas of the group each context belongs to, from
	// the group counters read once; groups no longer reported are dropped.
	deltas := r.deltas
	clear(deltas)
	for _, g := range s.groups {
		k := groupKey{g.Model, g.WorldSize}
		gc := r.groups[k]
		if gc == nil {
			gc = &groupCounters{}
			r.groups[k] = gc
		}
		deltas[k] = groupDelta{gc.lookups.Delta(float64(g.Lookups)), gc.asked.Delta(float64(g.RequestedChunks)),
			gc.hit.Delta(float64(g.HitChunks)), gc.tokens.Delta(float64(g.HitTokens))}
	}
	for k := range r.groups {
		if _, ok := deltas[k]; !ok {
			delete(r.groups, k)
		}
	}
	for _, c := range r.ctx {
		c.seen = false
	}
	var in, out float64
	for _, ci := range s.contexts {
		c := r.ctx[ci.InstanceID]
		if c == nil || c.model != ci.Model || c.worldSize != ci.WorldSize {
			// A history (~31 KB) only for a context with traffic: its own
			// bytes, or lookups of its model. Registrations alone (up to
			// --max-instances of them from anyone who reaches the port)
			// cost none.
			_, looked := deltas[groupKey{ci.Model, ci.WorldSize}]
			if ci.BytesIn == 0 && ci.BytesOut == 0 && !looked {
				continue
			}
			h := func() series.History { return series.NewHistoryOf(ctxFineLen, ctxCoarseLen) }
			c = &ctxRates{model: ci.Model, worldSize: ci.WorldSize,
				lookups: h(), asked: h(), hit: h(), tok: h(), storeB: h(), retrieveB: h()}
			// Every byte so far came since the last sample (it saw none).
			c.in.Delta(0)
			c.out.Delta(0)
			r.ctx[ci.InstanceID] = c
		}
		c.seen = true
		din, dout := c.in.Delta(float64(ci.BytesIn)), c.out.Delta(float64(ci.BytesOut))
		in, out = in+din, out+dout
		pushN(&c.storeB, per(din, elapsed), steps)
		pushN(&c.retrieveB, per(dout, elapsed), steps)
	}
	pushN(&r.storeB, per(in, elapsed), steps)
	pushN(&r.retrieveB, per(out, elapsed), steps)
	for id, c := range r.ctx {
		if !c.seen {
			delete(r.ctx, id) // unregistered (or dropped by a rebuild)
			continue
		}
		d := deltas[groupKey{c.model, c.worldSize}]
		pushN(&c.lookups, per(d.lookups, elapsed), steps)
		pushN(&c.asked, per(d.asked, elapsed), steps)
		pushN(&c.hit, per(d.hit, elapsed), steps)
		pushN(&c.tok, per(d.tokens, elapsed), steps)
		c.tokensTotal += int64(d.tokens)
	}

	r.latMu.RLock()
	for _, k := range r.lat {
		k.q.Sample(&k.h, elapsed, !k.sampled)
		k.sampled = true
	}
	r.latMu.RUnlock()
}

// resetInsight starts the lookup, hit and tokens-saved histories (the
// server's and each context's) again from now, with every lookup counter
// read as zero: the caller zeroes those counters, with sampleMu held.
func (r *rates) resetInsight(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resetAt = now
	r.marks = r.marks[:0]
	for _, c := range []*counterHistory{&r.lookups, &r.asked, &r.hit, &r.tokens} {
		c.h = series.NewHistory()
		c.c = series.Counter{}
		c.c.Delta(0)
	}
	r.tokensTotal = 0
	for _, gc := range r.groups {
		for _, c := range []*series.Counter{&gc.lookups, &gc.asked, &gc.hit, &gc.tokens} {
			*c = series.Counter{}
			c.Delta(0)
		}
	}
	for _, c := range r.ctx {
		for _, h := range []*series.History{&c.lookups, &c.asked, &c.hit, &c.tok} {
			*h = series.NewHistoryOf(ctxFineLen, ctxCoarseLen)
		}
		c.tokensTotal = 0
	}
}

// Window copies the histories for a snapshot.
func (r *rates) window() Rates {
	r.mu.Lock()
	defer r.mu.Unlock()
	sw := func(h *series.History) series.Window { return h.Window(snapServerFine, snapServerCoarse) }
	out := Rates{
		Taken: r.taken,
		Server: ServerRates{
			Lookups: sw(&r.lookups.h), AskedChunks: sw(&r.asked.h), HitChunks: sw(&r.hit.h),
			StoreBytes: sw(&r.storeB), RetrieveBytes: sw(&r.retrieveB), Evictions: sw(&r.evictions.h),
			PoolUsed: sw(&r.used), TokensSaved: sw(&r.tokens.h),
			TokensSavedTotal: r.tokensTotal, TokensSavedHour: r.tokens.h.Total(time.Hour),
		},
		Contexts: make(map[int64]ContextRates, len(r.ctx)),
		Latency:  map[string]LatencyRates{},
	}
	cw := func(h *series.History) series.Window { return h.Window(snapContextFine, 0) }
	for id, c := range r.ctx {
		out.Contexts[id] = ContextRates{
			Lookups: cw(&c.lookups), AskedChunks: cw(&c.asked), HitChunks: cw(&c.hit), TokensSaved: cw(&c.tok),
			StoreBytes: cw(&c.storeB), RetrieveBytes: cw(&c.retrieveB),
			TokensSavedTotal: c.tokensTotal, TokensSavedHour: c.tok.Total(time.Hour),
		}
	}
	r.latMu.RLock()
	for name, k := range r.lat {
		out.Latency[name] = LatencyRates{
			Rate: k.q.Rate.Window(snapLatencyFine, 0),
			P50:  k.q.P50.Window(snapLatencyFine, 0),
			P99:  k.q.P99.Window(snapLatencyFine, 0),
		}
	}
	r.latMu.RUnlock()
	return out
}

// SampleEvery is how often the engine samples its rates.
const SampleEvery = series.FineStep

// sampleRates reads the running plane's counters into the histories; a
// stopped engine (between planes) records zero rates.
func (e *Engine) sampleRates() {
	e.rates.sampleMu.Lock()
	defer e.rates.sampleMu.Unlock()
	s := sample{now: e.opts.Now()}
	if p := e.cur.Load().dataPlane; p != nil {
		e.rates.markWhatIf(s.now, p.whatif)
		e.tellUnregistered(s.now, p.lookup.Unregistered())
		s.lookup = p.lookup.Stats()
		s.groups = p.lookup.ModelStats()
		s.contexts = p.transfer.Contexts()
		ps := p.pool.Stats()
		s.evictions, s.used = float64(ps.Evictions), float64(ps.UsedBytes)
	}
	e.rates.add(s)
}
