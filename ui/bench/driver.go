package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/transfer/torchpickle"
)

// driverConfig is one mode's run against one server.
type driverConfig struct {
	Endpoint string
	Profile  *protocol.Profile
	Mode     string // "shm" | "pickle"
	Model    Model
	Chunks   int
	Workers  int
	Repeat   float64
	Timeout  time.Duration
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
}

// driver is N simulated LMCache non-GPU workers on the real wire protocol.
type driver struct {
	cfg       driverConfig
	lay       layout.Layout
	chunkTok  int
	pat       *pattern
	wl        *workload
	clients   []*client.Client
	shmName   string
	poolSize  int64
	seg       []byte // this process's own mapping of the advertised segment
	workerBuf int64  // bytes of per-worker buffers (for the RSS method)
	// dests are the workers' retrieve destinations (the "scatter into paged
	// KV"), prefaulted once; encs are their reused pickle encode buffers.
	dests [][]byte
	encs  [][]byte
}

// counters are one worker's results; merged after the phase.
type counters struct {
	storeBytes, retrieveBytes int64
	storeLat, retrieveLat     []time.Duration // per chunk: op time / chunks in op
	storeBusy, retrieveBusy   time.Duration   // timed parts of this worker's ops
	cachedStores              int64
	missChunks                int64
	mismatches                int64
	timeouts                  int64
	errors                    int64
	firstErr                  string
	ops                       int64
}

func (c *counters) fail(err error) {
	if errors.Is(err, client.ErrTimeout) {
		c.timeouts++
	} else {
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
	c.retrieveBusy += o.retrieveBusy
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

// newDriver dials one client per worker, learns the chunk size and registers
// every worker; SHM mode maps the advertised segment.
func newDriver(ctx context.Context, cfg driverConfig) (_ *driver, err error) {
	if cfg.ShmDir == "" {
		cfg.ShmDir = "/dev/shm"
	}
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
	}
	var st counters
	r, err := d.call(ctx, d.clients[0], &st, protocol.GetChunkSize)
	if err != nil {
		return nil, fmt.Errorf("GET_CHUNK_SIZE from %s: %w", cfg.Endpoint, err)
	}
	var chunk int64
	if err := r.Decode(&chunk); err != nil || chunk <= 0 {
		return nil, fmt.Errorf("GET_CHUNK_SIZE answered %d (%v)", chunk, err)
	}
	d.chunkTok = int(chunk)
	if d.lay, err = cfg.Model.chunkLayout(d.chunkTok); err != nil {
		return nil, err
	}
	d.pat = newPattern(int(d.lay.Bytes), 0xc0ffee)
	d.wl = newWorkload(d.chunkTok, cfg.Chunks, cfg.Repeat)
	for range cfg.Workers {
		dest := make([]byte, d.lay.Bytes)
		for i := 0; i < len(dest); i += 4096 {
			dest[i] = 1 // prefault: a worker's KV cache is resident
		}
		d.dests = append(d.dests, dest)
		d.workerBuf += int64(len(dest))
		if cfg.Mode == "pickle" {
			ts := make([]torchpickle.Tensor, cfg.Chunks)
			for j := range ts {
				ts[j] = torchpickle.Tensor{Dtype: d.lay.Dtype, Shape: d.lay.Shape, Data: d.pat.chunk(0)}
			}
			enc := make([]byte, 0, 5+max(0, torchpickle.EncodedSize(ts)))
			d.encs = append(d.encs, enc)
			d.workerBuf += int64(cap(enc))
		}
	}

	for w, c := range d.clients {
		r, err := d.call(ctx, c, &st, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{
			InstanceID: cfg.InstanceBase + int64(w), ModelName: "bench-" + cfg.Model.Name, WorldSize: 1,
			BlockSize: 16, NumLayers: cfg.Model.Layers, HiddenDimSize: cfg.Model.Hidden,
			DtypeStr: cfg.Model.Dtype, UseMLA: cfg.Model.MLA,
		})
		if err != nil {
			return nil, fmt.Errorf("register worker %d: %w", w, err)
		}
		var resp struct {
			ShmName  string `msgpack:"shm_name"`
			PoolSize int64  `msgpack:"pool_size"`
		}
		if err := r.Decode(&resp); err != nil {
			return nil, fmt.Errorf("register worker %d: %w", w, err)
		}
		d.shmName, d.poolSize = resp.ShmName, resp.PoolSize
	}
	shared := d.shmName != "" && d.poolSize > 0
	switch {
	case cfg.Mode == "shm" && !shared:
		return nil, errors.New("the server advertises no SHM segment (registration answered shm_name \"\"): SHM mode needs one")
	case cfg.Mode == "pickle" && shared:
		return nil, fmt.Errorf("the server advertises SHM segment %s: a pickle worker's retrieves would all miss (spec 4.10); bench pickle mode against a server run with --shm-name \"\"", d.shmName)
	}
	if cfg.Mode == "shm" {
		if d.seg, err = mapSegment(filepath.Join(cfg.ShmDir, strings.TrimPrefix(d.shmName, "/"))); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// mapSegment maps the whole segment shared and populated, as a worker that
// attached would touch it: page faults are not charged to the first copies.
func mapSegment(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("attach advertised segment: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("attach advertised segment: %w", err)
	}
	if fi.Size() <= 0 {
		return nil, fmt.Errorf("attach advertised segment %s: size %d", path, fi.Size())
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return b, nil
}

// close unregisters the workers, unmaps the segment and closes the clients.
func (d *driver) close(ctx context.Context) {
	var st counters
	for w, c := range d.clients {
		if d.lay.Bytes > 0 {
			_, _ = d.call(ctx, c, &st, protocol.UnregisterKVCache, d.cfg.InstanceBase+int64(w))
		}
		_ = c.Close()
	}
	d.clients = nil
	if d.seg != nil {
		_ = unix.Munmap(d.seg)
		d.seg = nil
	}
}

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

// commitRaw sends COMMIT_STORE with an already encoded bin frame.
func (d *driver) commitRaw(ctx context.Context, c *client.Client, st *counters, key protocol.Key, inst int64, bin []byte) (client.Reply, error) {
	spec, ok := d.cfg.Profile.ByName(protocol.CommitStore)
	if !ok {
		err := fmt.Errorf("profile %s has no COMMIT_STORE", d.cfg.Profile.Name)
		st.fail(err)
		return client.Reply{}, err
	}
	kf, err := protocol.Encode(key)
	if err != nil {
		st.fail(err)
		return client.Reply{}, err
	}
	idf, err := protocol.Encode(inst)
	if err != nil {
		st.fail(err)
		return client.Reply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	r, err := c.CallRaw(ctx, spec.Number, kf, idf, bin)
	if err != nil {
		err = fmt.Errorf("%s: %w", protocol.CommitStore, err)
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
		wall, busy := d.phase(ctx, &res.counters, round, d.storeWorker)
		res.storeWall += wall
		res.storeBusy += busy
		wall, busy = d.phase(ctx, &res.counters, round, d.retrieveWorker)
		res.retrieveWall += wall
		res.retrieveBusy += busy
		res.rounds++
		res.prompts += d.cfg.Workers * d.cfg.PromptsPerRound
		if d.cfg.ClearBetweenRounds {
			_, _ = d.call(ctx, d.clients[0], &res.counters, protocol.Clear)
		}
	}
	return res
}

type workerFunc func(ctx context.Context, w, round int, st *counters)

// phase runs fn on every worker concurrently and returns its wall time and
// the largest busy time of one worker.
func (d *driver) phase(ctx context.Context, total *counters, round int, fn workerFunc) (wall, busy time.Duration) {
	results := make([]counters, d.cfg.Workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range d.cfg.Workers {
		wg.Go(func() { fn(ctx, w, round, &results[w]) })
	}
	wg.Wait()
	wall = time.Since(start)
	for i := range results {
		busy = max(busy, results[i].storeBusy+results[i].retrieveBusy)
		total.merge(&results[i])
	}
	return wall, busy
}

func (d *driver) key(p prompt, end int, worker bool) protocol.Key {
	k := protocol.Key{ModelName: "bench-" + d.cfg.Model.Name, WorldSize: 1, TokenIDs: p.tokens, Start: 0, End: end, RequestID: p.requestID}
	if worker {
		zero := 0
		k.WorkerID = &zero
	}
	return k
}

// storeWorker stores the worker's prompts of the round (spec 4.2 / 4.3).
func (d *driver) storeWorker(ctx context.Context, w, round int, st *counters) {
	c, inst := d.clients[w], d.cfg.InstanceBase+int64(w)
	for i := range d.cfg.PromptsPerRound {
		p := d.wl.prompt(w, round, i)
		key := d.key(p, len(p.tokens), true)
		st.ops++
		start := time.Now()
		r, err := d.call(ctx, c, st, protocol.PrepareStore, key, inst)
		if err != nil {
			continue
		}
		var n int
		var data []byte
		if d.cfg.Mode == "shm" {
			if n, err = d.writeSlots(r, p); err != nil {
				st.fail(err)
				continue
			}
			if n == 0 {
				st.cachedStores++ // the worker skips its commit
				continue
			}
			data = []byte{}
		} else {
			ts := make([]torchpickle.Tensor, len(p.ids))
			for j, id := range p.ids {
				ts[j] = torchpickle.Tensor{Dtype: d.lay.Dtype, Shape: d.lay.Shape, Data: d.pat.chunk(id)}
			}
			// The pickle goes straight after a msgpack bin32 header in the
			// worker's reused buffer: the frame is built without another copy.
			enc := append(d.encs[w][:0], 0xc6, 0, 0, 0, 0)
			if enc, err = torchpickle.AppendEncode(enc, ts); err != nil {
				st.fail(fmt.Errorf("pickle chunks: %w", err))
				continue
			}
			binary.BigEndian.PutUint32(enc[1:5], uint32(len(enc)-5))
			d.encs[w], data, n = enc, enc, len(ts)
		}
		if data != nil && d.cfg.Mode == "pickle" {
			r, err = d.commitRaw(ctx, c, st, key, inst, data)
		} else {
			r, err = d.call(ctx, c, st, protocol.CommitStore, key, inst, data)
		}
		if err != nil {
			continue
		}
		var ok bool
		if err := r.Decode(&ok); err != nil || !ok {
			st.fail(fmt.Errorf("COMMIT_STORE of %s answered %v (%v)", p.requestID, ok, err))
			continue
		}
		el := time.Since(start)
		st.storeBusy += el
		st.storeBytes += int64(n) * d.lay.Bytes
		st.storeLat = append(st.storeLat, el/time.Duration(n))
	}
}

type wireSlot struct {
	Offset int64  `msgpack:"offset"`
	Length int64  `msgpack:"length"`
	Shape  []int  `msgpack:"shape"`
	Dtype  string `msgpack:"dtype"`
}

// checkSlot refuses a slot outside the mapping or of another size.
func (d *driver) checkSlot(s wireSlot) error {
	if s.Length != d.lay.Bytes || s.Offset < 0 || s.Offset+s.Length > int64(len(d.seg)) {
		return fmt.Errorf("slot {offset %d, length %d} does not fit a %d-byte chunk in the %d-byte segment", s.Offset, s.Length, d.lay.Bytes, len(d.seg))
	}
	return nil
}

// writeSlots copies the chunks the server asked for into their slots.
func (d *driver) writeSlots(r client.Reply, p prompt) (int, error) {
	var resp struct {
		Context struct {
			Slots        []wireSlot `msgpack:"slots"`
			ChunkIndices []int      `msgpack:"chunk_indices"`
		} `msgpack:"context"`
	}
	if err := r.Decode(&resp); err != nil {
		return 0, fmt.Errorf("PREPARE_STORE reply: %w", err)
	}
	for i, s := range resp.Context.Slots {
		idx := i
		if i < len(resp.Context.ChunkIndices) {
			idx = resp.Context.ChunkIndices[i]
		}
		if idx < 0 || idx >= len(p.ids) {
			return 0, fmt.Errorf("PREPARE_STORE chunk index %d out of %d", idx, len(p.ids))
		}
		if err := d.checkSlot(s); err != nil {
			return 0, fmt.Errorf("PREPARE_STORE: %w", err)
		}
		copy(d.seg[s.Offset:s.Offset+s.Length], d.pat.chunk(p.ids[idx]))
	}
	return len(resp.Context.Slots), nil
}

// lookup is the scheduler side: LOOKUP then QUERY_PREFETCH_STATUS until done.
func (d *driver) lookup(ctx context.Context, c *client.Client, st *counters, p prompt) (int, error) {
	if _, err := d.call(ctx, c, st, protocol.Lookup, d.key(p, len(p.tokens), false), int64(1)); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(d.cfg.Timeout)
	for {
		r, err := d.call(ctx, c, st, protocol.QueryPrefetchStatus, p.requestID)
		if err != nil {
			return 0, err
		}
		if r.Present {
			var hits int64
			if err := r.Decode(&hits); err != nil {
				st.fail(err)
				return 0, err
			}
			return int(hits), nil
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("QUERY_PREFETCH_STATUS %s: still running after %v: %w", p.requestID, d.cfg.Timeout, client.ErrTimeout)
			st.fail(err)
			return 0, err
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// retrieveWorker looks up and retrieves the worker's prompts of the round,
// verifying every chunk. Timed: PREPARE_RETRIEVE, the copies out (and the
// unpickling), COMMIT_RETRIEVE; the checksums are not.
func (d *driver) retrieveWorker(ctx context.Context, w, round int, st *counters) {
	c, inst, dest := d.clients[w], d.cfg.InstanceBase+int64(w), d.dests[w]
	for i := range d.cfg.PromptsPerRound {
		p := d.wl.prompt(w, round, i)
		st.ops++
		hits, err := d.lookup(ctx, c, st, p)
		if err != nil {
			continue
		}
		if hits > len(p.ids) {
			st.fail(fmt.Errorf("LOOKUP of %s: %d hits for %d chunks", p.requestID, hits, len(p.ids)))
			continue
		}
		st.missChunks += int64(len(p.ids) - hits)
		if hits > 0 {
			d.retrieveOne(ctx, c, inst, st, p, hits, dest)
		}
		_, _ = d.call(ctx, c, st, protocol.EndSession, p.requestID)
	}
}

func (d *driver) retrieveOne(ctx context.Context, c *client.Client, inst int64, st *counters, p prompt, hits int, dest []byte) {
	key := d.key(p, hits*d.chunkTok, true)
	var timed time.Duration
	start := time.Now()
	r, err := d.call(ctx, c, st, protocol.PrepareRetrieve, key, inst)
	if err != nil {
		return
	}
	got := 0
	if d.cfg.Mode == "shm" {
		var resp struct {
			Success bool `msgpack:"success"`
			Context struct {
				Slots []wireSlot `msgpack:"slots"`
			} `msgpack:"context"`
		}
		if err := r.Decode(&resp); err != nil {
			st.fail(fmt.Errorf("PREPARE_RETRIEVE reply: %w", err))
		} else if resp.Success {
			timed += time.Since(start)
			for j, s := range resp.Context.Slots {
				if j >= hits {
					break
				}
				if err := d.checkSlot(s); err != nil {
					st.mismatches++
					continue
				}
				t := time.Now()
				copy(dest, d.seg[s.Offset:s.Offset+s.Length])
				timed += time.Since(t)
				if checksum(dest) != d.pat.sum(p.ids[j]) {
					st.mismatches++
				}
				got++
			}
			if len(resp.Context.Slots) != hits {
				st.mismatches += int64(abs(hits - len(resp.Context.Slots)))
			}
			start = time.Now()
		}
	} else {
		data, success, err := pickleReply(r)
		if err != nil {
			st.fail(err)
		} else if success {
			ts, err := torchpickle.Decode(data, torchpickle.Limits{})
			if err != nil {
				st.fail(fmt.Errorf("unpickle PREPARE_RETRIEVE data: %w", err))
			}
			timed += time.Since(start)
			for j, t := range ts {
				if j >= hits || t.Dtype != d.lay.Dtype || int64(len(t.Data)) != d.lay.Bytes {
					st.mismatches++
					continue
				}
				t0 := time.Now()
				copy(dest, t.Data)
				timed += time.Since(t0)
				if checksum(dest) != d.pat.sum(p.ids[j]) {
					st.mismatches++
				}
				got++
			}
			if err == nil && len(ts) != hits {
				st.mismatches += int64(abs(hits - len(ts)))
			}
			start = time.Now()
		}
	}
	if got == 0 {
		st.missChunks += int64(hits)
		start = time.Now()
	}
	// The worker always commits, also after a miss.
	if _, err := d.call(ctx, c, st, protocol.CommitRetrieve, key, inst); err != nil {
		return
	}
	if got > 0 {
		timed += time.Since(start)
		st.retrieveBusy += timed
		st.retrieveBytes += int64(got) * d.lay.Bytes
		st.retrieveLat = append(st.retrieveLat, timed/time.Duration(got))
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// pickleReply reads {success, data, context} without copying data: kvdock
// and msgspec write the fields in declaration order, so the bin is sliced in
// place; any other shape goes through the generic decoder.
func pickleReply(r client.Reply) ([]byte, bool, error) {
	if data, ok, fast := scanRetrieveReply(r.Raw); fast {
		return data, ok, nil
	}
	var resp struct {
		Success bool   `msgpack:"success"`
		Data    []byte `msgpack:"data"`
	}
	if err := r.Decode(&resp); err != nil {
		return nil, false, fmt.Errorf("PREPARE_RETRIEVE reply: %w", err)
	}
	return resp.Data, resp.Success, nil
}

// scanRetrieveReply handles exactly fixmap{"success": bool, "data": bin, ...}.
func scanRetrieveReply(b []byte) (data []byte, success, ok bool) {
	if len(b) < 1 || b[0]&0xf0 != 0x80 || b[0]&0x0f < 2 {
		return nil, false, false
	}
	b = b[1:]
	const kSuccess = "\xa7success"
	if len(b) < len(kSuccess)+1 || string(b[:len(kSuccess)]) != kSuccess {
		return nil, false, false
	}
	b = b[len(kSuccess):]
	switch b[0] {
	case 0xc3:
		success = true
	case 0xc2:
	default:
		return nil, false, false
	}
	b = b[1:]
	const kData = "\xa4data"
	if len(b) < len(kData)+1 || string(b[:len(kData)]) != kData {
		return nil, false, false
	}
	b = b[len(kData):]
	var n, h int
	switch {
	case b[0] == 0xc4 && len(b) >= 2:
		n, h = int(b[1]), 2
	case b[0] == 0xc5 && len(b) >= 3:
		n, h = int(b[1])<<8|int(b[2]), 3
	case b[0] == 0xc6 && len(b) >= 5:
		n, h = int(b[1])<<24|int(b[2])<<16|int(b[3])<<8|int(b[4]), 5
	default:
		return nil, false, false
	}
	if len(b) < h+n {
		return nil, false, false
	}
	return b[h : h+n], success, true
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
	if b, err := protocol.Encode(d.key(probe, len(probe.tokens), false)); err == nil {
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
			if _, err := d.lookup(ctx, d.clients[w], st, p); err == nil {
				st.ops++
			}
		}
		_, _ = d.call(ctx, d.clients[w], st, protocol.EndSession, p.requestID)
	})
	return res
}
