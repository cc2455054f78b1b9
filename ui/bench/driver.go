package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"kvdock/core/layout"
	"kvdock/core/lookup"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/transfer/worker"
)

// driverConfig is one mode's run against one server.
type driverConfig struct {
	// AfterRound, when set, runs after each round (between rounds the
	// workers are idle): the bench samples its references there.
	AfterRound func()
	Endpoint   string
	Profile    *protocol.Profile
	Mode       string // "shm" | "pickle"
	Model      Model
	Chunks     int
	Workers    int
	Repeat     float64
	Timeout    time.Duration
	// PromptsPerRound is per worker; the working set of a round must fit the pool.
	PromptsPerRound int
	// Rounds > 0 runs exactly that many rounds; else rounds run until Duration.
	Rounds   int
	Duration time.Duration
	// ClearBetweenRounds sends CLEAR after each round (in-process servers only).
	ClearBetweenRounds bool
	// InstanceBase makes instance ids unique per run.
	InstanceBase int64
	ShmDir       string // default /dev/shm
	// PickleOnSHM allows pickle mode against a server that advertises a
	// segment: a kvdock (confirmed by its /status) switches a worker that
	// commits pickled chunks to pickle, so its retrieves get data. An
	// LMCache server would answer them with slots, all misses (spec 4.10).
	PickleOnSHM bool
	// Progress is told the phase and the bytes moved (nil: nobody).
	Progress *progress
	// EndStores ends each store's session (END_SESSION) once it is done:
	// a worker that only stores (the store stream) has no retrieve that
	// would end it, and a session left behind stays on the server for its
	// TTL.
	EndStores bool
	// Live: the server is not the bench's own (--host without
	// --server-process), so the workers register as benchmark traffic
	// (benchModel), which that server keeps apart from its real workers.
	Live bool
}

// driver is N simulated LMCache non-GPU workers on the real wire protocol,
// each a transfer/worker Worker on its own connection.
type driver struct {
	cfg      driverConfig
	lay      layout.Layout
	chunkTok int
	pat      *pattern
	wl       *workload
	clients  []*client.Client
	workers  []*worker.Worker
	scheds   []worker.Scheduler
	shmName  string
	poolSize int64
	seg      []byte // this process's one mapping of the advertised segment
	// workerBuf is the bytes of per-worker buffers (for the RSS method).
	workerBuf int64
	// dests are the workers' retrieve destinations (the "scatter into paged
	// KV"), prefaulted once.
	dests [][]byte
}

// counters are one worker's results; merged after the phase.
type counters struct {
	storeBytes, retrieveBytes int64
	storeLat, retrieveLat     []time.Duration // per chunk: op time / chunks in op
	storeBusy, retrieveBusy   time.Duration   // timed parts of this worker's ops
	verify                    time.Duration   // the bench's own checksums of retrieved chunks
	lookupBusy                time.Duration   // retrieves' LOOKUP + prefetch status polls
	storeCopy, retrieveCopy   time.Duration   // the copies alone within the timed parts (SHM)
	cachedStores              int64
	missChunks                int64
	mismatches                int64
	timeouts                  int64
	errors                    int64
	firstErr                  string
	ops                       int64
}

func (c *counters) fail(err error) {
	switch {
	case errors.Is(err, worker.ErrBadReply):
		c.mismatches++ // the server named bytes the request did not ask for
	case errors.Is(err, client.ErrTimeout), errors.Is(err, worker.ErrPrefetchPending):
		c.timeouts++
	default:
		c.errors++
	}
	if c.firstErr == "" {
		c.firstErr = err.Error()
	}
}

func (c *counters) merge(o *counters) {
	c.storeBytes += o.storeBytes
	c.retrieveBytes += o.retrieveBytes
	c.storeLat = append(c.storeLat, o.storeLat...)
	c.retrieveLat = append(c.retrieveLat, o.retrieveLat...)
	c.storeBusy += o.storeBusy
	c.storeCopy += o.storeCopy
	c.retrieveCopy += o.retrieveCopy
	c.retrieveBusy += o.retrieveBusy
	c.verify += o.verify
	c.lookupBusy += o.lookupBusy
	c.cachedStores += o.cachedStores
	c.missChunks += o.missChunks
	c.mismatches += o.mismatches
	c.timeouts += o.timeouts
	c.errors += o.errors
	c.ops += o.ops
	if c.firstErr == "" {
		c.firstErr = o.firstErr
	}
}

// newDriver dials one client per worker and registers every worker; in SHM
// mode the first maps the advertised segment (populated) and the others
// share that mapping, as the threads of one worker process would.
func newDriver(ctx context.Context, cfg driverConfig) (_ *driver, err error) {
	d := &driver{cfg: cfg}
	defer func() {
		if err != nil {
			d.close(context.Background())
		}
	}()
	for range cfg.Workers {
		c, err := client.Dial(cfg.Endpoint, cfg.Profile, client.Options{Timeout: cfg.Timeout})
		if err != nil {
			return nil, err
		}
		d.clients = append(d.clients, c)
		d.scheds = append(d.scheds, worker.Scheduler{C: c, Poll: 50 * time.Microsecond, Patience: cfg.Timeout})
	}
	for w, c := range d.clients {
		wcfg := worker.Config{
			InstanceID: cfg.InstanceBase + int64(w), Model: benchModel(cfg.Model, cfg.Live),
			Layers: cfg.Model.Layers, Hidden: cfg.Model.Hidden, Dtype: cfg.Model.Dtype, MLA: cfg.Model.MLA,
			Pickle: cfg.Mode == "pickle", ShmDir: cfg.ShmDir, Populate: true, Segment: d.seg,
		}
		if cfg.Mode == "pickle" {
			wcfg.EncodeChunks = cfg.Chunks
		}
		rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		wk, err := worker.Register(rctx, c, wcfg)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("register worker %d at %s: %w", w, cfg.Endpoint, err)
		}
		d.workers = append(d.workers, wk)
		d.shmName, d.poolSize = wk.ShmName(), wk.PoolSize()
		if d.seg == nil {
			d.seg = wk.Segment()
		}
		d.workerBuf += wk.EncodeBufferBytes()
	}
	shared := d.workers[0].Advertised()
	switch {
	case cfg.Mode == "shm" && !shared:
		return nil, errors.New("the server advertises no SHM segment (registration answered shm_name \"\"): SHM mode needs one")
	case cfg.Mode == "pickle" && shared && !cfg.PickleOnSHM:
		return nil, fmt.Errorf("the server shares segment %s and is not confirmed as a kvdock: a pickle worker's retrieves would all miss; bench pickle mode against a server run with --shm-name \"\"", d.shmName)
	}
	d.chunkTok, d.lay = d.workers[0].ChunkTokens(), d.workers[0].Layout()
	d.pat = newPattern(int(d.lay.Bytes), 0xc0ffee)
	d.wl = newWorkload(d.chunkTok, cfg.Chunks, cfg.Repeat)
	for range cfg.Workers {
		dest := make([]byte, d.lay.Bytes)
		for i := 0; i < len(dest); i += 4096 {
			dest[i] = 1 // prefault: a worker's KV cache is resident
		}
		d.dests = append(d.dests, dest)
		d.workerBuf += int64(len(dest))
	}
	return d, nil
}

// close unregisters the workers, unmaps the segment and closes the clients.
func (d *driver) close(ctx context.Context) {
	for _, wk := range d.workers {
		uctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
		_ = wk.Unregister(uctx)
		cancel()
	}
	// The first worker mapped the segment; the others share it.
	for i := len(d.workers) - 1; i >= 0; i-- {
		_ = d.workers[i].Close()
	}
	for _, c := range d.clients {
		_ = c.Close()
	}
	d.workers, d.clients, d.scheds, d.seg = nil, nil, nil, nil
}

// call sends a request that carries no data (NOOP, CLEAR, END_SESSION).
func (d *driver) call(ctx context.Context, c *client.Client, st *counters, name string, args ...any) (client.Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	r, err := c.Call(ctx, name, args...)
	if err != nil {
		err = fmt.Errorf("%s: %w", name, err)
		st.fail(err)
	}
	return r, err
}

// transferResult is the store/retrieve part of a mode's result. The
// phases' busy time is the slowest worker's timed work: lookups, session
// ends and checksums are not part of it.
type transferResult struct {
	counters
	storeWall, retrieveWall time.Duration
	storeBusy, retrieveBusy time.Duration
	// storeCopy, retrieveCopy: per phase the copy time of the worker with
	// the longest busy time, summed like the busy times.
	storeCopy, retrieveCopy time.Duration
	rounds, prompts         int
}

// transfer runs rounds of: every worker stores its prompts, then every
// worker looks them up and retrieves them; each phase's wall time counts.
func (d *driver) transfer(ctx context.Context) transferResult {
	var res transferResult
	start := time.Now()
	for round := 0; ; round++ {
		if d.cfg.Rounds > 0 && round >= d.cfg.Rounds {
			break
		}
		if d.cfg.Rounds <= 0 && round > 0 && time.Since(start) >= d.cfg.Duration {
			break
		}
		if ctx.Err() != nil {
			break
		}
		detail := fmt.Sprintf("round %d", round+1)
		if d.cfg.Rounds > 0 {
			detail += fmt.Sprintf("/%d", d.cfg.Rounds)
		}
		d.cfg.Progress.setPhase(d.cfg.Mode+": store/retrieve", detail+", store")
		wall, busy, copied := d.phase(ctx, &res.counters, round, d.storeWorker)
		res.storeWall += wall
		res.storeBusy += busy
		res.storeCopy += copied
		d.cfg.Progress.setPhase(d.cfg.Mode+": store/retrieve", detail+", retrieve")
		wall, busy, copied = d.phase(ctx, &res.counters, round, d.retrieveWorker)
		res.retrieveWall += wall
		res.retrieveBusy += busy
		res.retrieveCopy += copied
		res.rounds++
		res.prompts += d.cfg.Workers * d.cfg.PromptsPerRound
		if d.cfg.ClearBetweenRounds {
			_, _ = d.call(ctx, d.clients[0], &res.counters, protocol.Clear)
		}
		if d.cfg.AfterRound != nil {
			d.cfg.AfterRound()
		}
	}
	return res
}

type workerFunc func(ctx context.Context, w, round int, st *counters)

// phase runs fn on every worker concurrently and returns its wall time and
// the largest busy time of one worker, with that worker's copy time.
func (d *driver) phase(ctx context.Context, total *counters, round int, fn workerFunc) (wall, busy, copied time.Duration) {
	results := make([]counters, d.cfg.Workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range d.cfg.Workers {
		wg.Go(func() { fn(ctx, w, round, &results[w]) })
	}
	wg.Wait()
	wall = time.Since(start)
	for i := range results {
		if b := results[i].storeBusy + results[i].retrieveBusy; b >= busy {
			busy, copied = b, results[i].storeCopy+results[i].retrieveCopy
		}
		total.merge(&results[i])
	}
	return wall, busy, copied
}

// storeWorker stores the worker's prompts of the round (spec 4.2 / 4.3).
func (d *driver) storeWorker(ctx context.Context, w, round int, st *counters) {
	wk := d.workers[w]
	chunks := make([][]byte, 0, d.cfg.Chunks)
	for i := range d.cfg.PromptsPerRound {
		if ctx.Err() != nil {
			return // stopped (the store stream's turn ended): no more requests
		}
		p := d.wl.prompt(w, round, i)
		chunks = chunks[:0]
		for _, id := range p.ids {
			chunks = append(chunks, d.pat.chunk(id))
		}
		st.ops++
		start := time.Now()
		// A store once begun is finished even when ctx ends meanwhile (the
		// stream's turn is over, the run was stopped): a PREPARE_STORE left
		// without its COMMIT_STORE keeps its slots write-locked on the
		// server for the write TTL.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.Timeout)
		res, err := wk.Store(cctx, wk.Key(p.tokens, len(p.ids), p.requestID), chunks)
		cancel()
		if d.cfg.EndStores {
			_, _ = d.call(context.WithoutCancel(ctx), d.clients[w], st, protocol.EndSession, p.requestID)
		}
		switch {
		case err != nil:
			st.fail(fmt.Errorf("store %s: %w", p.requestID, err))
			continue
		case res.Skipped:
			st.cachedStores++ // the worker skips its commit
			continue
		case !res.Committed:
			st.fail(fmt.Errorf("COMMIT_STORE of %s answered false", p.requestID))
			continue
		}
		el := time.Since(start)
		st.storeBusy += el
		st.storeCopy += res.Copy
		st.storeBytes += int64(res.Chunks) * d.lay.Bytes
		d.cfg.Progress.add(int64(res.Chunks) * d.lay.Bytes)
		st.storeLat = append(st.storeLat, el/time.Duration(res.Chunks))
	}
}

// lookup is the scheduler side: LOOKUP then QUERY_PREFETCH_STATUS until done.
func (d *driver) lookup(ctx context.Context, w int, st *counters, p prompt) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*d.cfg.Timeout)
	defer cancel()
	hits, err := d.scheds[w].Hits(ctx, d.workers[w].LookupKey(p.tokens, p.requestID), 1)
	if err != nil {
		st.fail(err)
	}
	return hits, err
}

// retrieveWorker looks up and retrieves the worker's prompts of the round,
// verifying every chunk. Timed: PREPARE_RETRIEVE, the copies out (and the
// unpickling), COMMIT_RETRIEVE; the checksums are not.
func (d *driver) retrieveWorker(ctx context.Context, w, round int, st *counters) {
	for i := range d.cfg.PromptsPerRound {
		p := d.wl.prompt(w, round, i)
		st.ops++
		t := time.Now()
		hits, err := d.lookup(ctx, w, st, p)
		st.lookupBusy += time.Since(t)
		if err != nil {
			continue
		}
		if hits > len(p.ids) {
			st.fail(fmt.Errorf("LOOKUP of %s: %d hits for %d chunks: %w", p.requestID, hits, len(p.ids), worker.ErrBadReply))
			continue
		}
		st.missChunks += int64(len(p.ids) - hits)
		if hits > 0 {
			d.retrieveOne(ctx, w, st, p, hits)
		}
		// Ended also when the run was stopped: a session outlives its
		// worker on the server for its TTL.
		_, _ = d.call(context.WithoutCancel(ctx), d.clients[w], st, protocol.EndSession, p.requestID)
	}
}

func (d *driver) retrieveOne(ctx context.Context, w int, st *counters, p prompt, hits int) {
	wk, dest := d.workers[w], d.dests[w]
	var unTimed, copied time.Duration
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	got, err := wk.Retrieve(cctx, wk.Key(p.tokens, hits, p.requestID), func(j int, chunk []byte) {
		c := time.Now()
		copy(dest, chunk)
		t := time.Now()
		copied += t.Sub(c)
		if checksum(dest) != d.pat.sum(p.ids[j]) {
			st.mismatches++
		}
		unTimed += time.Since(t)
	})
	cancel()
	timed := time.Since(start) - unTimed
	st.verify += unTimed
	if err != nil {
		st.fail(fmt.Errorf("retrieve %s: %w", p.requestID, err))
		return
	}
	if got == 0 {
		st.missChunks += int64(hits)
		return
	}
	if got != hits {
		st.mismatches += int64(abs(hits - got))
	}
	st.retrieveBusy += timed
	st.retrieveCopy += copied
	st.retrieveBytes += int64(got) * d.lay.Bytes
	d.cfg.Progress.add(int64(got) * d.lay.Bytes)
	st.retrieveLat = append(st.retrieveLat, timed/time.Duration(got))
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// smallResult is the small-request rates of a mode.
type smallResult struct {
	noopRTPS       float64 // NOOP round trips per second, all workers
	lookupPairsPS  float64 // LOOKUP + QUERY_PREFETCH_STATUS pairs per second
	lookupMsgBytes int     // encoded LOOKUP payload size (for the echo reference)
	counters
}

// smallOps measures NOOP, then LOOKUP + QUERY_PREFETCH_STATUS of a 16-chunk
// prompt that is not cached (nothing stays locked), on every worker at once.
func (d *driver) smallOps(ctx context.Context, dur time.Duration) smallResult {
	var res smallResult
	lw := &workload{chunkTokens: d.chunkTok, chunks: 16}
	probe := lw.prompt(1<<15, 0, 0)
	if b, err := protocol.Encode(d.workers[0].LookupKey(probe.tokens, probe.requestID)); err == nil {
		res.lookupMsgBytes = len(b)
	}
	run := func(fn func(w int, st *counters, until time.Time)) float64 {
		results := make([]counters, d.cfg.Workers)
		var wg sync.WaitGroup
		start := time.Now()
		until := start.Add(dur)
		for w := range d.cfg.Workers {
			wg.Go(func() { fn(w, &results[w], until) })
		}
		wg.Wait()
		el := time.Since(start)
		var n int64
		for i := range results {
			n += results[i].ops
			results[i].ops = 0
			res.merge(&results[i])
		}
		return float64(n) / el.Seconds()
	}
	res.noopRTPS = run(func(w int, st *counters, until time.Time) {
		for time.Now().Before(until) && ctx.Err() == nil {
			if _, err := d.call(ctx, d.clients[w], st, protocol.Noop); err == nil {
				st.ops++
			}
		}
	})
	res.lookupPairsPS = run(func(w int, st *counters, until time.Time) {
		p := lw.prompt(1<<15+w, 0, 0)
		p.requestID = fmt.Sprintf("bench-small-w%d", w)
		for time.Now().Before(until) && ctx.Err() == nil {
			if _, err := d.lookup(ctx, w, st, p); err == nil {
				st.ops++
			}
		}
		_, _ = d.call(context.WithoutCancel(ctx), d.clients[w], st, protocol.EndSession, p.requestID)
	})
	return res
}

// echoTurns is how many turns smallOpsBesideEcho splits its time into.
const echoTurns = 4

// echoRates are the raw echo's round trips per second measured in turns
// with the mode's small requests.
type echoRates struct{ noop, lookup float64 }

// smallOpsBesideEcho is smallOps with its reference measured in turns with
// it: echoTurns times, the mode's NOOPs and LOOKUP+STATUS pairs for
// dur/echoTurns each, then the raw echo of the same NOOP and LOOKUP
// messages (as many streams as workers) for as long. The rates are the
// means over the turns, so a machine whose speed drifts during the run (a
// shared VM) moves the figure and its reference alike.
func (d *driver) smallOpsBesideEcho(ctx context.Context, dur time.Duration, noop, look [][]byte) (smallResult, echoRates, error) {
	var res smallResult
	var ech echoRates
	turn := max(dur/echoTurns, time.Millisecond)
	for range echoTurns {
		sr := d.smallOps(ctx, turn)
		res.noopRTPS += sr.noopRTPS / echoTurns
		res.lookupPairsPS += sr.lookupPairsPS / echoTurns
		res.lookupMsgBytes = sr.lookupMsgBytes
		res.merge(&sr.counters)
		e, err := echo(ctx, noop, d.cfg.Workers, turn)
		if err != nil {
			return res, ech, fmt.Errorf("echo of NOOP: %w", err)
		}
		ech.noop += e.RoundTripsPS / echoTurns
		e, err = echo(ctx, look, d.cfg.Workers, turn)
		if err != nil {
			return res, ech, fmt.Errorf("echo of LOOKUP: %w", err)
		}
		ech.lookup += e.RoundTripsPS / echoTurns
	}
	return res, ech, nil
}

// largestMessage is the size of a pickle commit of a whole prompt (every
// chunk pickled, with the request's other frames): the largest message of
// pickle mode (its retrieve replies carry the same chunks).
func (d *driver) largestMessage() int64 {
	var n int64
	for _, wk := range d.workers {
		n = max(n, wk.EncodeBufferBytes())
	}
	return n
}

// smallLoaded is smallOps measured under a store stream, with the stream's rate.
type smallLoaded struct {
	smallResult
	streamGBps float64
}

// smallOpsUnderStoreBesideEcho runs smallOps while one more worker
// (instance id instance, its own connection) stores one-chunk prompts
// without pause: a stream of chunk-sized stores (32 MiB for the default
// model) as the mode makes them (SHM: prepare, copy into the segment,
// commit; pickle: one commit message per chunk), new chunks each time (an
// in-process pool is cleared between the stream's rounds; a target server
// evicts). Its reference is measured in
// turns with it, as smallOpsBesideEcho does: echoTurns times, the requests
// under the stream, then the raw echo of the same NOOP and LOOKUP messages
// beside a raw stream of load messages, as long each.
func (d *driver) smallOpsUnderStoreBesideEcho(ctx context.Context, dur time.Duration, instance int64, noop, look, load [][]byte) (smallLoaded, echoRates, error) {
	var res smallLoaded
	var ech echoRates
	cfg := d.cfg
	cfg.Workers, cfg.Chunks, cfg.Repeat, cfg.InstanceBase, cfg.Progress, cfg.AfterRound = 1, 1, 0, instance, nil, nil
	cfg.EndStores = true
	ld, err := newDriver(ctx, cfg)
	if err != nil {
		return res, ech, fmt.Errorf("store stream worker: %w", err)
	}
	defer ld.close(context.Background())
	ld.cfg.PromptsPerRound = max(1, d.cfg.PromptsPerRound*d.cfg.Chunks/2)
	turn := max(dur/echoTurns, time.Millisecond)
	// Rounds are numbered apart from the measured ones and from an earlier
	// run's stream (a target server keeps what that stored), so the
	// stream's chunks are new to the pool.
	round := 1<<16 + int(time.Now().UnixNano()%(1<<24))
	var stream counters
	for range echoTurns {
		lr := d.underStream(ctx, ld, turn, &round, &stream)
		res.noopRTPS += lr.noopRTPS / echoTurns
		res.lookupPairsPS += lr.lookupPairsPS / echoTurns
		res.streamGBps += lr.streamGBps / echoTurns
		res.merge(&lr.counters)
		e, err := echoUnder(ctx, noop, d.cfg.Workers, turn, load)
		if err != nil {
			return res, ech, fmt.Errorf("echo of NOOP under a raw stream: %w", err)
		}
		ech.noop += e.RoundTripsPS / echoTurns
		e, err = echoUnder(ctx, look, d.cfg.Workers, turn, load)
		if err != nil {
			return res, ech, fmt.Errorf("echo of LOOKUP under a raw stream: %w", err)
		}
		ech.lookup += e.RoundTripsPS / echoTurns
	}
	if stream.storeBytes == 0 {
		return res, ech, fmt.Errorf("the store stream stored nothing (%d errors: %s)", stream.errors, stream.firstErr)
	}
	return res, ech, nil
}

// underStream runs smallOps for dur while ld stores without pause, its
// rounds numbered on from *round, adding what it stored to total.
func (d *driver) underStream(ctx context.Context, ld *driver, dur time.Duration, round *int, total *counters) smallLoaded {
	var stream counters
	defer total.merge(&stream)
	if ld.cfg.ClearBetweenRounds {
		// The last turn's round was cut short before its clear: start
		// from an empty pool, as the first turn does.
		_, _ = ld.call(ctx, ld.clients[0], &stream, protocol.Clear)
	}
	lctx, stop := context.WithCancel(ctx)
	streamDone := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(streamDone)
		for ; lctx.Err() == nil; *round++ {
			ld.storeWorker(lctx, 0, *round, &stream)
			if ld.cfg.ClearBetweenRounds && lctx.Err() == nil {
				_, _ = ld.call(lctx, ld.clients[0], &stream, protocol.Clear)
			}
		}
	}()
	sr := d.smallOps(ctx, dur)
	stop()
	<-streamDone
	el := time.Since(start)
	return smallLoaded{smallResult: sr, streamGBps: float64(stream.storeBytes) / el.Seconds() / 1e9}
}

// benchModel is the model name the benchmark's workers register. Against
// a live server it is marked as benchmark traffic (lookup.BenchModelPrefix):
// that server keeps it out of the real workers' hit ratio, tokens saved,
// miss breakdown and what-if, gives it only the pool's room below the
// watermark, never lets it evict another model's chunks and never writes
// it to a tier. The bench's own servers treat it as any model, so that
// what is measured there is the path real workers take.
func benchModel(m Model, live bool) string {
	if !live {
		return m.Name
	}
	return lookup.BenchModelPrefix + m.Name
}
