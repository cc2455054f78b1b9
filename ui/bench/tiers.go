package bench

// The L2 tier figures (--l2-adapter): per adapter, an in-process engine with
// that one tier; the workers store chunks (write-behind copies them to the
// tier), L1 is cleared, and LOOKUP + retrieve bring them back from the tier.
// Each is compared with a reference measured in the same run against the
// same target: plain sequential file I/O of the same bytes on the tier's
// filesystem (fs), valkey-go's raw SET/GET of the same values on the same
// server (resp). NOOP and LOOKUP round trips while the tier is saturated
// with writes are compared with the same load on an engine without a tier.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"kvdock/core/engine"
	"kvdock/core/protocol"
	"kvdock/core/tierstate"
	"kvdock/settings"
)

// TierResult is one L2 adapter's figures and their references.
type TierResult struct {
	Type   string `json:"type"`
	Target string `json:"target"`
	// Write: the workers' stores until the write-behind queue has drained,
	// bytes as the tier counted them (values with their headers).
	WriteBytes    int64   `json:"write_bytes"`
	WriteGBps     float64 `json:"write_gbps"`
	DroppedWrites uint64  `json:"dropped_writes"`
	// Read, after L1 was cleared, readTurns times (in turns with the
	// reference's read): bytes as the tier counted them over the slowest
	// worker's time from each LOOKUP until QUERY_PREFETCH_STATUS reported
	// the prefetch done (the chunks read from the tier, checked and
	// published in L1, locked for the retrieve): the prefetch-read. The
	// misses are those of every turn.
	ReadBytes  int64   `json:"read_bytes"`
	ReadGBps   float64 `json:"prefetch_read_gbps"`
	ReadMisses int64   `json:"read_miss_chunks"`
	// ReadRetrieveGBps is the same bytes over the slowest worker's whole
	// LOOKUP + prefetch + retrieve (the copies out of L1 included), less
	// the bench's own checksums: what a worker sees end to end.
	ReadRetrieveGBps float64 `json:"prefetch_and_retrieve_gbps"`
	// Reference is what the tier is compared with, in words.
	Reference    string  `json:"reference"`
	RefWriteGBps float64 `json:"reference_write_gbps"`
	RefReadGBps  float64 `json:"reference_read_gbps"`
	WriteRatio   float64 `json:"write_vs_reference"`
	ReadRatio    float64 `json:"prefetch_read_vs_reference"`
	// Small requests while a background worker keeps storing new chunks,
	// with the tier (saturated) and on an engine without tiers.
	NoopRTPS         float64 `json:"noop_round_trips_per_s"`
	NoopNoTierRTPS   float64 `json:"noop_no_tier_round_trips_per_s"`
	NoopRatio        float64 `json:"noop_vs_no_tier"`
	LookupRTPS       float64 `json:"lookup_status_round_trips_per_s"`
	LookupNoTierRTPS float64 `json:"lookup_status_no_tier_round_trips_per_s"`
	LookupRatio      float64 `json:"lookup_status_vs_no_tier"`
	SaturatedDropped uint64  `json:"saturated_dropped_writes"`

	Mismatches int64  `json:"checksum_mismatches"`
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
}

// tierWorkers is the write-behind writers per tier, the reference's write
// streams.
const tierWorkers = engine.TierWorkers

// runTiers measures every adapter in turn, each with its own no-tier
// small-request reference measured in turns with it.
func runTiers(ctx context.Context, o Options, prof *protocol.Profile, pool int64, instanceBase int64) ([]*TierResult, error) {
	var out []*TierResult
	var errs []error
	for i, a := range o.Adapters {
		base := instanceBase + int64(i+1)<<6
		tr, err := runTier(ctx, o, prof, pool, a, base)
		if tr != nil {
			out = append(out, tr)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tier %d (%v): %w", i, a.Type, err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	return out, errors.Join(errs...)
}

// runTier measures one adapter.
func runTier(ctx context.Context, o Options, prof *protocol.Profile, pool int64, adapter settings.Adapter, base int64) (*TierResult, error) {
	typ := adapter.Type
	o.progress.setPhase("tiers: "+typ+" write and prefetch-read", "")
	eng, ep, err := startEngine(ctx, o, "shm", pool, []settings.Adapter{adapter})
	if err != nil {
		return nil, err
	}
	defer func() { _ = eng.Stop(context.Background()) }()
	d, err := newDriver(ctx, driverConfig{
		Endpoint: ep, Profile: prof, Mode: "shm", Model: o.Model, Chunks: o.Chunks,
		Workers: o.Workers, Repeat: o.Repeat, Timeout: o.Timeout, Rounds: 1,
		InstanceBase: base, Progress: o.progress,
	})
	if err != nil {
		return nil, err
	}
	defer d.close(context.Background())
	d.cfg.PromptsPerRound = promptsFor(o, pool, d.lay.Bytes)

	st0, err := tierStats(eng)
	if err != nil {
		return nil, err
	}
	tr := &TierResult{Type: st0.Type, Target: st0.Target}
	var c counters
	start := time.Now()
	d.phase(ctx, &c, 0, d.storeWorker)
	st1, err := drained(ctx, eng, o.Timeout*4)
	wall := time.Since(start)
	if err != nil {
		return tr, err
	}
	tr.WriteBytes = int64(st1.WriteBytes - st0.WriteBytes)
	tr.WriteGBps = round4(gbps(tr.WriteBytes, wall))
	tr.DroppedWrites = st1.DroppedWrites - st0.DroppedWrites

	// The reference stores the same bytes in values of the same size: the
	// chunks written are those committed less those dropped.
	written := c.storeBytes/d.lay.Bytes - int64(tr.DroppedWrites)
	if written <= 0 || tr.WriteBytes <= 0 {
		return tr, fmt.Errorf("nothing was written to the tier (%d chunks stored, %d writes dropped)", c.storeBytes/d.lay.Bytes, tr.DroppedWrites)
	}
	valSize := int(tr.WriteBytes / written)
	n := int(written)
	o.progress.setPhase("tiers: "+typ+" reference", "")
	var ref readRef
	switch typ {
	case "fs":
		tr.Reference = fmt.Sprintf("sequential write/read of one file of the same bytes (%d × %s) in base_path, no fsync (as the tier)", n, settings.BytesText(int64(valSize)))
		ref, tr.RefWriteGBps, err = newFileRef(adapter.FS.BasePath, valSize, n)
	case "resp":
		tr.Reference = fmt.Sprintf("valkey-go SET/GET of the same values (%d × %s) on the same server, %d writers / %d readers as the tier", n, settings.BytesText(int64(valSize)), tierWorkers, prefetchStreams(o))
		ref, tr.RefWriteGBps, err = newRespRef(ctx, adapter.RESP, valSize, n, prefetchStreams(o))
	default:
		err = fmt.Errorf("no reference for tier type %q", typ)
	}
	if err != nil {
		return tr, fmt.Errorf("reference: %w", err)
	}
	defer ref.close()

	// The prefetch-read and the reference's read in turns (L1 cleared
	// before each): a machine whose speed drifts during the run (a shared
	// VM) moves both alike.
	o.progress.setPhase("tiers: "+typ+" prefetch-read", fmt.Sprintf("in %d turns with the reference's read", readTurns))
	var prefetchTime, readTime, refTime time.Duration
	var refBytes int64
	for range readTurns {
		if _, err := d.call(ctx, d.clients[0], &c, protocol.Clear); err != nil {
			return tr, fmt.Errorf("clear L1: %w", err)
		}
		rc, pt, rt := readBack(ctx, d)
		prefetchTime += pt
		readTime += rt
		tr.ReadMisses += rc.missChunks
		c.merge(&rc)
		got, el, err := ref.read(ctx)
		if err != nil {
			return tr, fmt.Errorf("reference: %w", err)
		}
		refBytes += got
		refTime += el
	}
	st2, err := tierStats(eng)
	if err != nil {
		return tr, err
	}
	tr.ReadBytes = int64(st2.ReadBytes - st1.ReadBytes)
	tr.ReadGBps = round4(gbps(tr.ReadBytes, prefetchTime))
	tr.ReadRetrieveGBps = round4(gbps(tr.ReadBytes, readTime))
	tr.RefReadGBps = round4(gbps(refBytes, refTime))
	tr.WriteRatio = ratio(tr.WriteGBps, tr.RefWriteGBps)
	tr.ReadRatio = ratio(tr.ReadGBps, tr.RefReadGBps)
	d.close(context.Background())
	_ = eng.Stop(context.Background())

	o.progress.setPhase("tiers: "+typ+" small requests, tier saturated", "in turns with an engine without a tier")
	sat, plain, dropped, err := saturatedTurns(ctx, o, prof, pool, &adapter, base+32)
	tr.NoopRTPS, tr.LookupRTPS, tr.SaturatedDropped = round4(sat.noopRTPS), round4(2*sat.lookupPairsPS), dropped
	tr.NoopNoTierRTPS, tr.LookupNoTierRTPS = round4(plain.noopRTPS), round4(2*plain.lookupPairsPS)
	tr.Mismatches, tr.Errors, tr.FirstError = c.mismatches, c.errors+c.timeouts, c.firstErr
	return tr, err
}

// readBack is the retrieve phase of round 0 (LOOKUP, the prefetch from the
// tier, retrieve) on every worker, and its times: the slowest worker's time
// in LOOKUP and its prefetch status polls (the prefetch-read), and the
// slowest worker's elapsed time less its own checksums of the chunks
// (bench work).
func readBack(ctx context.Context, d *driver) (total counters, prefetch, all time.Duration) {
	results := make([]counters, d.cfg.Workers)
	took := make([]time.Duration, d.cfg.Workers)
	var wg sync.WaitGroup
	for w := range d.cfg.Workers {
		wg.Go(func() {
			start := time.Now()
			d.retrieveWorker(ctx, w, 0, &results[w])
			took[w] = time.Since(start) - results[w].verify
		})
	}
	wg.Wait()
	for w := range results {
		total.merge(&results[w])
		prefetch = max(prefetch, results[w].lookupBusy)
		all = max(all, took[w])
	}
	return total, prefetch, all
}

// prefetchStreams is the tier loads in flight (--l2-prefetch-max-in-flight's
// default, which the bench's engine keeps), the reference's read streams.
func prefetchStreams(Options) int { return settings.Default().L2.PrefetchMaxInFlight }

func tierStats(eng *engine.Engine) (tierstate.Tier, error) {
	s := eng.Snapshot().Tiers
	if len(s) != 1 {
		return tierstate.Tier{}, fmt.Errorf("the engine runs %d tiers, want 1", len(s))
	}
	return s[0], nil
}

// drained waits until the tier's write-behind queue is empty.
func drained(ctx context.Context, eng *engine.Engine, limit time.Duration) (tierstate.Tier, error) {
	deadline := time.Now().Add(limit)
	for {
		st, err := tierStats(eng)
		if err != nil {
			return st, err
		}
		if st.QueueDepth == 0 && st.QueueBytes == 0 {
			return st, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return st, fmt.Errorf("the tier's write queue did not drain within %v (%d items left)", limit, st.QueueDepth)
		}
		time.Sleep(time.Millisecond)
	}
}

// saturation is an engine (with one tier, or none) with a driver for the
// small requests and one more worker that can keep storing new chunks
// (clearing L1 after each round), so that the tier's queue stays full.
type saturation struct {
	eng   *engine.Engine
	d, ld *driver
	tier  bool
}

func newSaturation(ctx context.Context, o Options, prof *protocol.Profile, pool int64, adapter *settings.Adapter, base int64) (*saturation, error) {
	var adapters []settings.Adapter
	if adapter != nil {
		adapters = []settings.Adapter{*adapter}
	}
	eng, ep, err := startEngine(ctx, o, "shm", pool, adapters)
	if err != nil {
		return nil, err
	}
	s := &saturation{eng: eng, tier: adapter != nil}
	mk := func(workers int, b int64) (*driver, error) {
		return newDriver(ctx, driverConfig{
			Endpoint: ep, Profile: prof, Mode: "shm", Model: o.Model, Chunks: o.Chunks,
			Workers: workers, Repeat: 0, Timeout: o.Timeout, Rounds: 1, InstanceBase: b,
		})
	}
	if s.d, err = mk(o.Workers, base); err != nil {
		s.close()
		return nil, err
	}
	if s.ld, err = mk(1, base+16); err != nil {
		s.close()
		return nil, err
	}
	s.ld.cfg.PromptsPerRound = max(1, promptsFor(o, pool, s.ld.lay.Bytes)/2)
	return s, nil
}

func (s *saturation) close() {
	if s.ld != nil {
		s.ld.close(context.Background())
	}
	if s.d != nil {
		s.d.close(context.Background())
	}
	_ = s.eng.Stop(context.Background())
}

// measure runs the small requests for dur while the extra worker stores
// without pause; round is where its prompts continue (each call stores new
// chunks).
func (s *saturation) measure(ctx context.Context, dur time.Duration, round *int) (sr smallResult, dropped uint64, err error) {
	var before tierstate.Tier
	if s.tier {
		if before, err = tierStats(s.eng); err != nil {
			return sr, 0, err
		}
	}
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var loadErr atomic.Value
	wg.Go(func() {
		var c counters
		for lctx.Err() == nil {
			*round++
			s.ld.storeWorker(lctx, 0, *round, &c)
			if _, err := s.ld.call(lctx, s.ld.clients[0], &c, protocol.Clear); err != nil && lctx.Err() == nil {
				loadErr.Store(err)
				return
			}
		}
	})
	sr = s.d.smallOps(ctx, dur)
	stop()
	wg.Wait()
	if s.tier {
		if after, err := tierStats(s.eng); err == nil {
			dropped = after.DroppedWrites - before.DroppedWrites
		}
	}
	if e, ok := loadErr.Load().(error); ok {
		return sr, dropped, fmt.Errorf("background store load: %w", e)
	}
	if sr.errors > 0 || sr.timeouts > 0 {
		return sr, dropped, fmt.Errorf("small requests: %d errors, %d timeouts: %s", sr.errors, sr.timeouts, sr.firstErr)
	}
	return sr, dropped, nil
}

// saturatedTurns measures NOOP and LOOKUP+STATUS round trips on an engine
// with adapter as its only tier, its queue kept full, and the same load on
// an engine without a tier, in four turns each way (dur/4 per turn): both
// engines run side by side, one loaded at a time, so a machine whose speed
// drifts during the run (a shared VM) moves the figure and its reference
// alike. The rates are the means over the turns.
func saturatedTurns(ctx context.Context, o Options, prof *protocol.Profile, pool int64, adapter *settings.Adapter, base int64) (withTier, noTier smallResult, dropped uint64, err error) {
	tiered, err := newSaturation(ctx, o, prof, pool, adapter, base)
	if err != nil {
		return withTier, noTier, 0, err
	}
	defer tiered.close()
	plain, err := newSaturation(ctx, o, prof, pool, nil, base+8)
	if err != nil {
		return withTier, noTier, 0, fmt.Errorf("the engine without a tier: %w", err)
	}
	defer plain.close()
	const turns = 4
	turn := max(o.SmallOps/turns, time.Millisecond)
	var tieredRound, plainRound int
	add := func(into *smallResult, sr smallResult) {
		into.noopRTPS += sr.noopRTPS / turns
		into.lookupPairsPS += sr.lookupPairsPS / turns
		into.merge(&sr.counters)
	}
	for range turns {
		sr, d, err := tiered.measure(ctx, turn, &tieredRound)
		add(&withTier, sr)
		dropped += d
		if err != nil {
			return withTier, noTier, dropped, err
		}
		sr, _, err = plain.measure(ctx, turn, &plainRound)
		add(&noTier, sr)
		if err != nil {
			return withTier, noTier, dropped, fmt.Errorf("without a tier: %w", err)
		}
	}
	return withTier, noTier, dropped, nil
}

// readTurns is how many times the prefetch-read and its reference's read
// run, in turns.
const readTurns = 3

// readRef is a tier's reference store, written once: each read reads all
// of it back and returns the bytes and the time taken; close removes it.
type readRef interface {
	read(ctx context.Context) (int64, time.Duration, error)
	close()
}

// fileRef is one file of n values of size bytes in the tier's directory.
type fileRef struct {
	path string
	size int
}

// newFileRef writes n values of size bytes to one new file in dir,
// sequentially, and closes it; it returns the rate of that write.
func newFileRef(dir string, size, n int) (*fileRef, float64, error) {
	f, err := os.CreateTemp(dir, ".kvdock-bench-ref-*")
	if err != nil {
		return nil, 0, fmt.Errorf("file reference: %w", err)
	}
	r := &fileRef{path: f.Name(), size: size}
	buf := newPattern(size, 0xbeef).chunk(0)
	start := time.Now()
	for range n {
		if _, err := f.Write(buf); err != nil {
			f.Close()
			r.close()
			return nil, 0, fmt.Errorf("file reference: write %s: %w", r.path, err)
		}
	}
	if err := f.Close(); err != nil {
		r.close()
		return nil, 0, fmt.Errorf("file reference: close %s: %w", r.path, err)
	}
	return r, round4(gbps(int64(size)*int64(n), time.Since(start))), nil
}

// read reads the file back sequentially, a value's size at a time.
func (r *fileRef) read(context.Context) (int64, time.Duration, error) {
	f, err := os.Open(filepath.Clean(r.path))
	if err != nil {
		return 0, 0, fmt.Errorf("file reference: %w", err)
	}
	defer f.Close()
	buf := make([]byte, r.size)
	start := time.Now()
	var got int64
	for {
		k, err := f.Read(buf)
		got += int64(k)
		if err != nil {
			break
		}
	}
	return got, time.Since(start), nil
}

func (r *fileRef) close() { _ = os.Remove(r.path) }

// respRef is n values of size bytes SET through a plain valkey-go client
// to the adapter's server(s).
type respRef struct {
	c                valkey.Client
	size, n, readers int
	key              func(i int) string
}

// newRespRef SETs n values of size bytes with tierWorkers streams and
// returns the rate; reads GET them with readers streams.
func newRespRef(ctx context.Context, adapter settings.RESPAdapter, size, n, readers int) (*respRef, float64, error) {
	opt, err := engine.RESPClientOption(adapter)
	if err != nil {
		return nil, 0, fmt.Errorf("resp reference: %w", err)
	}
	c, err := valkey.NewClient(opt)
	if err != nil {
		return nil, 0, fmt.Errorf("valkey client: %w", err)
	}
	pid := os.Getpid()
	r := &respRef{c: c, size: size, n: n, readers: readers, key: func(i int) string { return fmt.Sprintf("kvdock-bench-ref:%d:%d", pid, i) }}
	val := valkey.BinaryString(newPattern(size, 0xbeef).chunk(0))
	el, err := r.each(tierWorkers, func(i int) error {
		return c.Do(ctx, c.B().Set().Key(r.key(i)).Value(val).Build()).Error()
	})
	if err != nil {
		r.close()
		return nil, 0, fmt.Errorf("SET: %w", err)
	}
	return r, round4(gbps(int64(size)*int64(n), el)), nil
}

// each runs f for every value index on streams goroutines and times it.
func (r *respRef) each(streams int, f func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, streams)
	start := time.Now()
	for s := range streams {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= r.n || errs[s] != nil {
					return
				}
				errs[s] = f(i)
			}
		})
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

func (r *respRef) read(ctx context.Context) (int64, time.Duration, error) {
	el, err := r.each(r.readers, func(i int) error {
		b, err := r.c.Do(ctx, r.c.B().Get().Key(r.key(i)).Build()).AsBytes()
		if err == nil && len(b) != r.size {
			err = fmt.Errorf("GET %s: %d bytes, want %d", r.key(i), len(b), r.size)
		}
		return err
	})
	if err != nil {
		return 0, el, fmt.Errorf("GET: %w", err)
	}
	return int64(r.size) * int64(r.n), el, nil
}

func (r *respRef) close() {
	for i := range r.n {
		_ = r.c.Do(context.Background(), r.c.B().Del().Key(r.key(i)).Build()).Error()
	}
	r.c.Close()
}
