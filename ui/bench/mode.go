package bench

// The transfer-mode phase: stores, retrieves and small requests in one
// mode (SHM or pickle) against one engine.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"kvdock/core/protocol"
	"kvdock/settings"
)

// runMode measures one transfer mode against a fresh in-process engine or
// the target server.
func runMode(ctx context.Context, o Options, prof *protocol.Profile, mode string, tgt *target, pool, instanceBase int64) (*ModeResult, int, error) {
	endpoint := endpointOf(o.Host, o.Port)
	if o.Host == "" {
		o.progress.setPhase(mode+": starting the engine", "")
		eng, ep, err := startEngine(ctx, o, mode, pool, nil)
		if err != nil {
			return nil, 0, err
		}
		defer func() { _ = eng.Stop(context.Background()) }()
		endpoint = ep
	}
	d, err := newDriver(ctx, driverConfig{
		Endpoint: endpoint, Profile: prof, Mode: mode, Model: o.Model, Chunks: o.Chunks,
		Workers: o.Workers, Repeat: o.Repeat, Timeout: o.Timeout, Rounds: o.Rounds,
		Duration: o.Duration, ClearBetweenRounds: o.Host == "" || o.ServerProcess, InstanceBase: instanceBase,
		PickleOnSHM: tgt != nil && tgt.status != nil, Progress: o.progress, Live: o.Host != "" && !o.ServerProcess,
	})
	if err != nil {
		return nil, 0, err
	}
	defer d.close(context.Background())
	// A target's pool: from /status, else advertised, else unknown (0).
	if tgt != nil {
		pool, _ = tgt.pool()
	}
	if err := sizeRounds(o, d, tgt, pool); err != nil {
		return nil, 0, err
	}

	mr := &ModeResult{Mode: mode, Endpoint: endpoint, ShmName: d.shmName, PoolBytes: pool, LookupChunks: 16}
	r := &modeRun{o: o, mode: mode, d: d, tgt: tgt, pool: pool, mr: mr}
	tr, err := r.transfers(ctx)
	if err != nil {
		return nil, 0, err
	}
	d.cfg.AfterRound = nil
	r.segRef(o.RefDuration / 2)
	if len(mr.segSamples) > 0 {
		mr.MemcpyIntoSegmentGBps = round4(mean(mr.segSamples))
	}
	if len(mr.segOutSamples) > 0 {
		mr.MemcpyFromSegmentGBps = round4(mean(mr.segOutSamples))
	}
	if err := r.smallRequests(ctx, prof, &tr, instanceBase); err != nil {
		return nil, 0, err
	}
	mr.Mismatches, mr.Timeouts, mr.Errors, mr.FirstError = tr.mismatches, tr.timeouts, tr.errors, tr.firstErr
	return mr, d.chunkTok, nil
}

// sizeRounds sets the prompts of a round for the pool (unknown: kvdock's
// default) and, on a live server, to the room the real workers leave.
func sizeRounds(o Options, d *driver, tgt *target, pool int64) error {
	sizing := pool
	if sizing == 0 {
		sizing = 1 << 30 // unknown: assume kvdock's default
	}
	d.cfg.PromptsPerRound = promptsFor(o, sizing, d.lay.Bytes)
	if room, ok := tgt.benchRoom(); ok && o.Host != "" && !o.ServerProcess {
		// A live server: the bench's stores get only the room below the
		// watermark the real workers' chunks leave, and evict nothing of
		// theirs; one round is sized to it.
		round := int64(o.Workers) * int64(o.Chunks) * alignedChunk(d.lay.Bytes)
		if room < round {
			return fmt.Errorf("the server's pool has %s below its eviction watermark that other models' chunks leave, one round of %d worker(s) × %d chunk(s) needs %s, and the bench never evicts another model's chunks: run it when the pool has room, with fewer --chunks or --workers, or against a server of its own (no --host)",
				settings.BytesText(room), o.Workers, o.Chunks, settings.BytesText(round))
		}
		if o.Prompts <= 0 {
			d.cfg.PromptsPerRound = max(1, min(d.cfg.PromptsPerRound, int(room*7/10/round)))
		}
	}
	return nil
}

// modeRun is one mode's measurement: its driver and what it has found.
type modeRun struct {
	o    Options
	mode string
	d    *driver
	tgt  *target
	pool int64
	mr   *ModeResult
}

// segRef samples the segment reference: the same copy into the segment's
// own pages, which the fresh in-process pool does not use yet (the
// transfers and their clear between rounds leave them free again for the
// second sample).
func (r *modeRun) segRef(dur time.Duration) {
	d, mr := r.d, r.mr
	if r.mode == "shm" && r.o.Host == "" && len(d.seg) > 0 {
		src := d.pat.chunk(0)
		n := min(int64(len(d.seg))/2/int64(len(src)), memcpyDests) * int64(len(src))
		mr.segSamples = append(mr.segSamples, round4(copyRate(d.seg[:n], src, dur)))
		// The retrieve's direction: out of the same pages into the
		// first worker's resident destination, the buffer its
		// retrieves copy each chunk into (no new memory in the peak).
		mr.segOutSamples = append(mr.segOutSamples, round4(copyOutRate(d.dests[0], d.seg[:n], dur)))
	}
}

// transfers runs the store and retrieve rounds and notes their rates and
// latencies, the CPU they took and the peak RSS beyond the pool.
func (r *modeRun) transfers(ctx context.Context) (transferResult, error) {
	o, mr := r.o, r.mr
	meter := cpuMeter{pid: o.ServerPID}
	rssPID := o.ServerPID
	rssOK := o.Host == "" || o.ServerPID > 0
	if rssOK {
		if o.Host == "" {
			// Give back what earlier phases freed, so their garbage is not
			// part of this mode's peak.
			debug.FreeOSMemory()
		}
		if err := resetHWM(rssPID); err != nil && o.Host == "" {
			return transferResult{}, err
		}
	}
	r.segRef(o.RefDuration / 2)
	// Sampled between the rounds too (the pool is cleared there, so its
	// low pages are free again), so that a machine whose memory bandwidth
	// drifts during the run (a shared VM) moves the reference with the
	// transfers; the mean of the samples is kept.
	r.d.cfg.AfterRound = func() { r.segRef(o.RefDuration / 4) }
	cpu0, cpuErr := meter.seconds()
	tr := r.d.transfer(ctx)
	cpu1, cpuErr2 := meter.seconds()
	hwm, rssErr := int64(0), error(nil)
	if rssOK {
		hwm, rssErr = vmHWM(rssPID)
		mr.RSSNow = rssBreakdown(rssPID)
	}
	mr.Rounds, mr.Prompts = tr.rounds, tr.prompts
	mr.StoreBytes, mr.RetrieveByte = tr.storeBytes, tr.retrieveBytes
	mr.StoreGBps = round4(gbps(tr.storeBytes, tr.storeBusy))
	mr.RetrieveGBps = round4(gbps(tr.retrieveBytes, tr.retrieveBusy))
	mr.StoreWallGBps = round4(gbps(tr.storeBytes, tr.storeWall))
	if r.mode == "shm" && o.Workers == 1 {
		// One worker's copies over their own time; with more workers the
		// busy time is the slowest worker's and its copies are not all the
		// bytes, so no copy rate is given.
		mr.StoreCopyGBps = round4(gbps(tr.storeBytes, tr.storeCopy))
		mr.RetrieveCopyGBps = round4(gbps(tr.retrieveBytes, tr.retrieveCopy))
	}
	mr.RetrieveWallGBps = round4(gbps(tr.retrieveBytes, tr.retrieveWall))
	mr.StoreP50us, mr.StoreP99us = percentileUS(tr.storeLat, 50), percentileUS(tr.storeLat, 99)
	mr.RetrieveP50, mr.RetrieveP99 = percentileUS(tr.retrieveLat, 50), percentileUS(tr.retrieveLat, 99)
	mr.CachedStores, mr.MissChunks = tr.cachedStores, tr.missChunks

	r.cpuFigures(float64(tr.storeBytes+tr.retrieveBytes)/1e9, cpu1-cpu0, errors.Join(cpuErr, cpuErr2))
	r.rssFigures(rssOK, hwm, rssErr)
	return tr, nil
}

// cpuFigures notes the CPU seconds per GB moved and how they were measured.
func (r *modeRun) cpuFigures(moved, cpu float64, cpuErr error) {
	o, mr := r.o, r.mr
	switch {
	case cpuErr != nil:
		mr.CPUSecondsPerGB, mr.CPUMethod = -1, "not measured: "+cpuErr.Error()
	case moved == 0:
		mr.CPUSecondsPerGB, mr.CPUMethod = -1, "not measured: nothing moved"
	case o.ServerPID > 0:
		mr.CPUSecondsPerGB, mr.CPUMethod = round4(cpu/moved), fmt.Sprintf("server pid %d, /proc/%d/stat utime+stime over the store and retrieve phases", o.ServerPID, o.ServerPID)
	default:
		mr.CPUSecondsPerGB, mr.CPUMethod = round4(cpu/moved), "getrusage(RUSAGE_SELF) over the store and retrieve phases: client and server together (in process)"
		if o.Host != "" {
			mr.CPUMethod = "getrusage of the bench only (no --server-pid): client CPU"
		}
	}
}

// rssFigures notes the peak RSS beyond the pool and how it was measured.
func (r *modeRun) rssFigures(rssOK bool, hwm int64, rssErr error) {
	o, mr, d, pool, tgt := r.o, r.mr, r.d, r.pool, r.tgt
	switch {
	case !rssOK:
		mr.PeakRSSBeyondMiB, mr.RSSMethod = -1, "not measured: give --server-pid"
	case rssErr != nil:
		mr.PeakRSSBeyondMiB, mr.RSSMethod = -1, "not measured: "+rssErr.Error()
	case o.Host == "":
		mappings := int64(1)
		if r.mode == "shm" {
			mappings = 2
		}
		own := int64(len(d.pat.data)) + d.workerBuf
		mr.PeakRSSBeyondMiB = round4(float64(hwm-pool*mappings-own) / (1 << 20))
		mr.RSSMethod = fmt.Sprintf("VmHWM %d − pool %d × %d mappings − bench buffers %d", hwm, pool, mappings, own)
	case pool == 0:
		why := "its HTTP API is off (--http-port 0)"
		if tgt.statusErr != nil {
			why = fmt.Sprintf("its /status (%s) could not be used: %v", tgt.statusURL, tgt.statusErr)
		}
		mr.PeakRSSBeyondMiB, mr.RSSMethod = -1, fmt.Sprintf("not measured: the server's pool size is unknown (a pickle server advertises none, and %s); give --http-host/--http-port", why)
	default:
		resident, from := tgt.residentPool()
		mr.PeakRSSBeyondMiB = round4(float64(hwm-resident) / (1 << 20))
		mr.RSSMethod = fmt.Sprintf("server VmHWM %d − %s %d", hwm, from, resident)
	}
}

// smallRequests measures NOOP and LOOKUP+STATUS round trips beside the raw
// echo, alone and under a store stream; their failures count in tr.
func (r *modeRun) smallRequests(ctx context.Context, prof *protocol.Profile, tr *transferResult, instanceBase int64) error {
	o, mr, d, mode := r.o, r.mr, r.d, r.mode
	o.progress.setPhase(mode+": small requests", "NOOP, LOOKUP+STATUS, in turns with the raw echo")
	small, look, typ, err := echoFrames(d.workers[0].Model(), d.chunkTok, prof)
	if err != nil {
		return err
	}
	sr, ech, err := d.smallOpsBesideEcho(ctx, o.SmallOps, small, look)
	if err != nil {
		tr.fail(fmt.Errorf("small requests: %w", err))
	}
	mr.NoopRTPS = round4(sr.noopRTPS)
	mr.LookupPairsPS = round4(sr.lookupPairsPS)
	mr.LookupRTPS = round4(2 * sr.lookupPairsPS)
	mr.EchoNoopRTPS, mr.EchoLookupRTPS = round4(ech.noop), round4(ech.lookup)
	tr.merge(&sr.counters)
	if mode == "pickle" {
		mr.LargestMessageBytes = d.largestMessage()
	}
	o.progress.setPhase(mode+": small requests under a store stream", "NOOP, LOOKUP+STATUS, in turns with the raw echo under a raw stream")
	uid, _ := protocol.Encode(int64(1) << 40)
	large := [][]byte{uid, typ(protocol.CommitStore), d.pat.chunk(1)}
	lr, lech, err := d.smallOpsUnderStoreBesideEcho(ctx, o.SmallOps, instanceBase+200, small, look, large)
	if err != nil {
		tr.fail(fmt.Errorf("small requests under a store stream: %w", err))
	} else {
		mr.NoopLoadedRTPS = round4(lr.noopRTPS)
		mr.LookupLoadedRTPS = round4(2 * lr.lookupPairsPS)
		mr.StreamGBps = round4(lr.streamGBps)
		mr.EchoNoopLoadedRTPS, mr.EchoLookupLoadedRTPS = round4(lech.noop), round4(lech.lookup)
		tr.merge(&lr.counters)
	}
	return nil
}

func gbps(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds() / 1e9
}
