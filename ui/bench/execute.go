package bench

// The run: sizing, the in-process engine, and the phases Execute drives
// in order (the target check, the modes, the tiers, the references).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"kvdock/assets"
	"kvdock/core/engine"
	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/settings"
)

// shmDir is where segments live (POSIX shm_open's tmpfs).
const shmDir = "/dev/shm"

// inProcessChunkTokens is the chunk size of the in-process engine (kvdock's default).
const inProcessChunkTokens = 256

// alignedChunk is a chunk's footprint in the pool (4 KiB aligned allocations).
func alignedChunk(b int64) int64 { return (b + 4095) &^ 4095 }

// poolFor returns the in-process pool size: the flag, or 1 GiB grown until
// one round (every worker storing one prompt) fits in 70% of it, below the
// eviction watermark (80%).
func poolFor(o Options, chunkBytes int64) int64 {
	if o.PoolBytes > 0 {
		return o.PoolBytes
	}
	need := int64(float64(int64(o.Workers)*int64(o.Chunks)*alignedChunk(chunkBytes)) / 0.7)
	need = (need + (1<<20 - 1)) &^ (1<<20 - 1)
	return max(int64(1)<<30, need)
}

// promptsFor is prompts per worker per round: 70% of the pool, at least one.
func promptsFor(o Options, pool, chunkBytes int64) int {
	if o.Prompts > 0 {
		return o.Prompts
	}
	n := int(float64(pool) * 0.7 / float64(int64(o.Workers)*int64(o.Chunks)*alignedChunk(chunkBytes)))
	return max(1, min(n, 64))
}

// profileAndLayout loads the wire profile the workers speak and the
// layout of one chunk of the model, as the server is started with.
func (o Options) profileAndLayout() (*protocol.Profile, layout.Layout, error) {
	prof, err := protocol.Load(o.Protocol, assets.Protocol)
	if err != nil {
		return nil, layout.Layout{}, err
	}
	lay, err := o.Model.chunkLayout(inProcessChunkTokens)
	if err != nil {
		return nil, layout.Layout{}, err
	}
	return prof, lay, nil
}

// Execute runs the benchmark; the Result is returned also with an error
// (whatever was measured before it).
func Execute(ctx context.Context, o Options) (*Result, error) {
	prof, lay, err := o.profileAndLayout()
	if err != nil {
		return nil, err
	}
	res := &Result{
		Schema: 1, Command: "kvdock bench " + strings.Join(o.Args, " "), Started: time.Now().UTC(),
		Config: RunConfig{
			Model: o.Model, ChunkTokens: inProcessChunkTokens, ChunkBytes: lay.Bytes, Chunks: o.Chunks,
			Workers: o.Workers, Repeat: o.Repeat, DurationSeconds: o.Duration.Seconds(),
			InProcess: o.Host == "", ServerPID: o.ServerPID, CPUs: runtime.NumCPU(),
		},
	}
	if res.Config.InProcess {
		res.Config.PoolBytes = poolFor(o, lay.Bytes)
		res.Notes = append(res.Notes,
			"in-process: CPU seconds per GB is getrusage of the whole process, so it mixes the workers' (client) and the server's CPU",
			"in-process: peak RSS beyond the pool = VmHWM (reset per mode through /proc/self/clear_refs) − pool × its mappings in this process (the server's, plus the SHM workers' own MAP_POPULATE mapping) − the bench's own buffers (chunk pattern, per-worker retrieve destinations and pickle encode buffers); pickle mode also holds the workers' own copies of each message (libzmq's and Go's): --server-process measures the server alone",
			"the large echo reference counts bytes in both directions (a round trip moves the message twice); pickle store and retrieve count each chunk once",
			"SHM figures compare against a single-stream memcpy of the same chunk bytes into prefaulted shared-memory pages (references.memcpy_segment_gbps; private memory: memcpy_gbps, shown as store/retrieve_vs_memcpy_private); with several workers they share the CPUs")
	}
	modes := []string{o.Mode}
	if o.Mode == "both" {
		modes = []string{"shm", "pickle"}
	}
	var tgt *target
	if !res.Config.InProcess {
		res.Config.Endpoint = endpointOf(o.Host, o.Port)
		if !o.ServerProcess {
			res.Notes = append(res.Notes, "target server: nothing is cleared between rounds; evicted chunks show as misses")
		}
		o.progress.setPhase("checking the server", "")
		if tgt, err = probeTarget(ctx, o, prof, int64(os.Getpid())<<12+3<<8); err != nil {
			return nil, err
		}
		res.Config.PoolBytes, _ = tgt.pool()
		var run []string
		for _, m := range modes {
			if ok, why := tgt.servable(m); !ok {
				res.Skipped = append(res.Skipped, Skip{Mode: m, Reason: why})
				continue
			}
			run = append(run, m)
		}
		if len(run) == 0 {
			var why []string
			for _, sk := range res.Skipped {
				why = append(why, sk.Mode+" mode: "+sk.Reason)
			}
			return nil, fmt.Errorf("nothing to measure against %s:\n  %s", res.Config.Endpoint, strings.Join(why, "\n  "))
		}
		if tgt.advertised() && slices.Contains(run, "pickle") {
			res.Notes = append(res.Notes, "pickle mode against a server sharing a segment: the workers are those that could not attach it; kvdock switches each to pickle at its first store (one fallback event per worker in the server's log)")
		}
		modes = run
	}
	// memcpy is measured before the modes and again with the other
	// references; the better figure is the reference (the stricter ratio on a
	// noisy machine).
	refSrc := newPattern(int(lay.Bytes), 0xc0ffee).chunk(0)
	memcpyBefore := memcpyGBps(refSrc, o.RefDuration/2)
	// Where SHM mode runs in process, the segment reference is measured in
	// the segment itself (runMode); elsewhere in a tmpfs mapping of the
	// pool's size, sampled here and with the other references.
	ownSegment := res.Config.InProcess && slices.Contains(modes, "shm")
	var tmpfsSamples []float64
	var tmpfsErr error
	tmpfsRef := func(dur time.Duration) {
		if ownSegment || tmpfsErr != nil {
			return
		}
		v, err := tmpfsCopyRate(shmDir, res.Config.PoolBytes, refSrc, dur)
		if err != nil {
			tmpfsErr = err
			return
		}
		tmpfsSamples = append(tmpfsSamples, round4(v))
	}
	tmpfsRef(o.RefDuration / 2)
	var errs []error
	for i, mode := range modes {
		mr, chunkTok, err := runMode(ctx, o, prof, mode, tgt, res.Config.PoolBytes, int64(os.Getpid())<<12+int64(i)<<8)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s mode: %w", mode, err))
		}
		if mr == nil {
			continue
		}
		if chunkTok != res.Config.ChunkTokens {
			res.Config.ChunkTokens = chunkTok
			if l, err := o.Model.chunkLayout(chunkTok); err == nil {
				res.Config.ChunkBytes = l.Bytes
			}
		}
		if mode == "shm" {
			res.SHM = mr
		} else {
			res.Pickle = mr
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(o.Adapters) > 0 {
		trs, err := runTiers(ctx, o, prof, res.Config.PoolBytes, int64(os.Getpid())<<12+int64(len(modes))<<8)
		res.Tiers = trs
		if err != nil {
			errs = append(errs, fmt.Errorf("tiers: %w", err))
		}
		res.Notes = append(res.Notes,
			"tiers: one in-process engine per adapter with that one tier; write = the stores until the write-behind queue drained (the tier's byte count over that wall time); prefetch-read = LOOKUP + prefetch + retrieve after L1 was cleared (the tier's read bytes over the slowest worker's time for it, less the bench's own checksums)",
			"tiers: NOOP and LOOKUP+STATUS are measured while one more worker keeps storing new chunks, on an engine with the tier (its write queue full) and on one without a tier (the same load)")
	}
	o.progress.setPhase("references", "memcpy, raw ZMQ echo")
	if err := res.measureReferences(ctx, o, prof); err != nil {
		errs = append(errs, err)
	}
	res.References.MemcpySamplesGBps = []float64{round4(memcpyBefore), res.References.MemcpyGBps}
	res.References.MemcpyGBps = max(res.References.MemcpyGBps, round4(memcpyBefore))
	tmpfsRef(o.RefDuration)
	switch {
	case ownSegment && res.SHM != nil && len(res.SHM.segSamples) > 0:
		res.References.MemcpySegmentSamplesGBps = res.SHM.segSamples
		res.References.MemcpySegmentGBps = res.SHM.MemcpyIntoSegmentGBps
		res.References.MemcpySegmentMethod = fmt.Sprintf("memcpy into the in-process engine's own segment %s (the bench's MAP_SHARED|MAP_POPULATE mapping, pages the pool was not using), sampled before the SHM transfers, between their rounds and after them, the mean kept; SHM targets are judged against it", res.SHM.ShmName)
	case ownSegment:
		res.References.MemcpySegmentMethod = "not measured: SHM mode did not reach its transfers; SHM targets are judged against memcpy into private memory"
	case tmpfsErr != nil:
		res.References.MemcpySegmentMethod = "not measured: " + tmpfsErr.Error() + "; SHM targets are judged against memcpy into private memory"
	default:
		res.References.MemcpySegmentSamplesGBps = tmpfsSamples
		res.References.MemcpySegmentGBps = slices.Max(tmpfsSamples)
		why := "a target server's segment is its live pool, which the bench must not overwrite"
		if res.Config.InProcess {
			why = "no in-process segment in this run"
		}
		res.References.MemcpySegmentMethod = fmt.Sprintf("memcpy into a MAP_SHARED mapping of an unlinked %s file of the pool's size (%d bytes), tmpfs pages like the segment's (%s), before and after the modes, the better kept; SHM targets are judged against it", shmDir, max(res.Config.PoolBytes, int64(memcpyDests)*lay.Bytes), why)
	}
	res.finish()
	return res, errors.Join(errs...)
}

func endpointOf(host string, port int) string {
	if host == "localhost" {
		host = "127.0.0.1"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return "tcp://" + host + ":" + strconv.Itoa(port)
}

// startEngine starts a kvdock engine on a free loopback port with a segment
// name of its own (SHM) or SHM off (pickle), and waits for the pool's
// prefault so the first stores do not pay for it. The adapters (none: nil)
// are its L2 tiers, with a write queue as large as the pool so that a
// measured write is never dropped for want of queue room.
func startEngine(ctx context.Context, o Options, mode string, pool int64, adapters []settings.Adapter) (*engine.Engine, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	cfg := settings.Default()
	cfg.Server.Host = "127.0.0.1"
	cfg.Server.Port = port
	cfg.Server.Protocol = o.Protocol
	cfg.L1.SizeGB = float64(pool) / (1 << 30)
	cfg.L1.Prefault = true
	lay, err := o.Model.chunkLayout(cfg.Server.ChunkSize)
	if err != nil {
		return nil, "", err
	}
	cfg.Server.MaxMessageBytes = max(cfg.Server.MaxMessageBytes, int64(o.Chunks)*lay.Bytes*2+(1<<20))
	name := ""
	if mode == "shm" {
		name = fmt.Sprintf("kvdock_bench_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	}
	cfg.Server.ShmName = &name
	cfg.L2.Adapters = adapters
	cfg.L2.QueueBytes = max(cfg.L2.QueueBytes, pool)
	if err := settings.Validate(cfg, nil); err != nil {
		return nil, "", fmt.Errorf("bench engine config: %w", err)
	}
	eng := engine.New(cfg, engine.Options{Logger: slog.New(slog.DiscardHandler), Version: "bench"})
	if err := eng.Start(ctx); err != nil {
		return nil, "", fmt.Errorf("start engine: %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := eng.Snapshot()
		if s.Pool.Prefaulted >= s.Pool.Size || time.Now().After(deadline) || ctx.Err() != nil {
			return eng, s.Endpoint, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}
