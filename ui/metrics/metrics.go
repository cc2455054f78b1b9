// Package metrics is kvdock's Prometheus side: a private registry holding the
// request counters and latency histogram fed by the wire server (Metrics is an
// engine.Observer) and a collector that reads the engine's snapshot at scrape
// time for everything else (pool, lookups, contexts, transfer bytes, bad
// input, GPU memory, the L2 tiers as kvdock_tier_* by index and type). Names follow upstream's lmcache_mp.* instruments where
// one exists; kvdock's own figures are kvdock_*.
//
// Every metric exists from the first scrape, at zero, not only after
// traffic. Counters derived from the snapshot stay monotonic across engine
// restarts and pool rebuilds (which reset the engine's own counters): the
// collector accumulates the increase it sees between scrapes.
package metrics

import (
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kvdock/core/engine"
	"kvdock/core/protocol"
	"kvdock/core/tierstate"
	"kvdock/core/workers"
)

// Source is what the collector reads at scrape time; *engine.Engine is one.
type Source interface {
	Snapshot() engine.Snapshot
}

// outcomes are the request outcomes every request type is primed with.
var outcomes = [...]string{engine.OutcomeOK, engine.OutcomeError, engine.OutcomeDropped}

// badKinds are the bad-input kinds primed at zero; others appear when seen.
func badKinds() []string {
	return []string{
		protocol.KindShort, protocol.KindBadHeader, protocol.KindUnknownType, protocol.KindArity,
		protocol.KindPayload, protocol.KindOversized, protocol.KindNoHandler, protocol.KindHandlerErr,
		protocol.KindPanic, protocol.KindTooMany, protocol.KindCUDAUnsupported, protocol.KindSendFailed,
	}
}

// Metrics owns the private registry. Create it before the engine (it is the
// engine's Observer), then Watch the engine.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	snap     *snapshotCollector
}

// New returns the metrics with an empty private registry (plus the Go and
// process collectors). Snapshot-derived metrics appear once Watch is called.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvdock_requests_total",
			Help: "Wire requests handled, by request type and outcome (ok, error, dropped).",
		}, []string{"type", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvdock_request_duration_seconds",
			Help: "Time from decode to reply queued, by request type.",
			// 50 µs … ~5 s: inline requests take microseconds, large
			// pickled stores and retrieves take up to seconds.
			Buckets: prometheus.ExponentialBucketsRange(50e-6, 5, 16),
		}, []string{"type"}),
	}
	m.snap = newSnapshotCollector(m)
	// The request vectors are collected by the snapshot collector, after it
	// primed them with the profile's request types: the registry collects
	// collectors concurrently, so priming in a sibling would come too late.
	m.reg.MustRegister(m.snap,
		prometheus.NewGoCollector(),
		prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// OnRequest implements engine.Observer: one call per dispatched request.
func (m *Metrics) OnRequest(name, outcome string, dur time.Duration) {
	m.requests.WithLabelValues(name, outcome).Inc()
	m.duration.WithLabelValues(name).Observe(dur.Seconds())
}

var _ engine.Observer = (*Metrics)(nil)

// Watch makes the snapshot-derived metrics read src at every scrape.
func (m *Metrics) Watch(src Source) { m.snap.setSource(src) }

// Registry is the private registry, for tests and custom handlers.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text (or negotiated) format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// prime creates the request series of every type the profile knows, so
// they exist at zero before traffic.
func (m *Metrics) prime(names []string) {
	for _, n := range names {
		for _, o := range outcomes {
			m.requests.WithLabelValues(n, o)
		}
		m.duration.WithLabelValues(n)
	}
}

// counter turns raw cumulative values that reset (engine restart, pool
// rebuild) into a monotonic total: it adds each increase it observes and,
// after a drop, the new raw value.
type counter struct {
	last, total float64
	seen        bool
}

func (c *counter) observe(raw float64) float64 {
	switch {
	case !c.seen:
		c.total = raw
	case raw >= c.last:
		c.total += raw - c.last
	default:
		c.total += raw
	}
	c.last, c.seen = raw, true
	return c.total
}

// ctxKey identifies one registration of an instance (a re-registration
// restarts its counters).
type ctxKey struct {
	id         int64
	registered time.Time
}

type ctxBytes struct{ in, out int64 }

// snapshotCollector derives metrics from engine.Snapshot at scrape time.
type snapshotCollector struct {
	m     *Metrics
	rates ratesDescs

	memUsed, usageRatio, capacity, objects, activeJobs *prometheus.Desc
	resident, usable, usableRatio                      *prometheus.Desc
	l1Read, l1Write, l1Evicted, l1AllocFail, l1Ticks   *prometheus.Desc
	lookupReq, lookupHit, lookups                      *prometheus.Desc
	transferBytes, contexts, badInput                  *prometheus.Desc
	contextStates, lastSeen, reaped, removed, reused   *prometheus.Desc
	gpuUsed, gpuTotal, up, sessions, inFlight          *prometheus.Desc

	tierUp, tierState, tierUsed, tierCapacity, tierObjects, tierQueue, tierQueueBytes *prometheus.Desc
	tierHits, tierMisses, tierCorrupt, tierDropped, tierRead, tierWrite               *prometheus.Desc
	tierLoads, tierLoadTimeouts                                                       *prometheus.Desc
	misses                                                                            missDescs
	whatif                                                                            whatIfDescs
	restart                                                                           restartDescs
	protocol                                                                          protocolDescs
	kvEvents                                                                          kvEventsDescs

	mu       sync.Mutex
	src      Source
	counters map[string]*counter
	// last per-registration bytes, and the totals they were added to.
	ctx   map[ctxKey]ctxBytes
	bytes map[[2]string]float64 // {mode, direction} → bytes
}

func newSnapshotCollector(m *Metrics) *snapshotCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &snapshotCollector{
		rates:            newRatesDescs(),
		m:                m,
		memUsed:          d("lmcache_mp_l1_memory_usage_bytes", "L1 pool bytes allocated to objects."),
		usageRatio:       d("lmcache_mp_l1_usage_ratio", "L1 pool bytes allocated over its capacity."),
		capacity:         d("kvdock_l1_capacity_bytes", "L1 pool allocatable bytes."),
		objects:          d("kvdock_l1_objects", "Objects held in the L1 pool."),
		resident:         d("kvdock_l1_resident_bytes", "L1 pool bytes of objects not doomed by a clear."),
		usable:           d("kvdock_l1_usable_bytes", "L1 resident bytes a lookup can reach: first chunks and chunks whose previous chunk is resident."),
		usableRatio:      d("kvdock_l1_usable_ratio", "L1 usable bytes over resident bytes (1 when empty)."),
		activeJobs:       d("lmcache_mp_active_prefetch_jobs", "Lookup jobs waiting for QUERY_PREFETCH_STATUS."),
		l1Read:           d("lmcache_mp_l1_read_total", "Keys read-locked in L1 (lookup and retrieve hits)."),
		l1Write:          d("lmcache_mp_l1_write_total", "Objects reserved for writing in L1."),
		l1Evicted:        d("lmcache_mp_l1_evicted_total", "Objects evicted from L1 by policy."),
		l1AllocFail:      d("lmcache_mp_l1_allocation_failure_total", "L1 write reservations refused for lack of space."),
		l1Ticks:          d("lmcache_mp_l1_eviction_loop_ticks_total", "Iterations of the L1 eviction loop."),
		lookupReq:        d("lmcache_mp_lookup_requested_total", "Tokens sent with LOOKUP requests."),
		lookupHit:        d("lmcache_mp_lookup_hit_total", "Tokens found by LOOKUP requests."),
		lookups:          d("lmcache_mp_lookups_total", "LOOKUP requests."),
		transferBytes:    d("kvdock_transfer_bytes_total", "KV bytes moved, by transfer mode (shm, pickle) and direction (in = stored, out = served).", "mode", "direction"),
		contexts:         d("kvdock_contexts", "Registered worker contexts by transfer mode.", "mode"),
		badInput:         d("kvdock_bad_input_total", "Bad wire input by kind.", "kind"),
		contextStates:    d("kvdock_contexts_by_state", "Worker contexts by liveness state (active, idle; reaped and removed are the last few remembered).", "state"),
		lastSeen:         d("kvdock_context_last_seen_seconds", "Seconds since a registered worker instance was last heard of.", "instance_id"),
		reaped:           d("kvdock_workers_reaped_total", "Worker instances dropped by the liveness reaper."),
		removed:          d("kvdock_workers_removed_total", "Worker instances removed by the operator (dashboard, ctl, HTTP)."),
		reused:           d("kvdock_instance_id_reused_total", "Instance ids registered again from another ZMQ peer, taken as new workers."),
		gpuUsed:          d("kvdock_gpu_memory_used_bytes", "GPU memory in use.", "gpu", "name"),
		gpuTotal:         d("kvdock_gpu_memory_total_bytes", "GPU memory in total.", "gpu", "name"),
		up:               d("kvdock_up", "1 while the engine is serving, else 0."),
		sessions:         d("kvdock_active_sessions", "Token sessions held."),
		inFlight:         d("kvdock_requests_in_flight", "Wire requests being handled."),
		tierUp:           d("kvdock_tier_up", "1 while the L2 tier answers (up or degraded), else 0.", "index", "type"),
		tierState:        d("kvdock_tier_state", "1 for the L2 tier's current state (up, down, degraded), 0 for the others.", "index", "type", "state"),
		tierUsed:         d("kvdock_tier_used_bytes", "Bytes the L2 tier holds.", "index", "type"),
		tierCapacity:     d("kvdock_tier_capacity_bytes", "Bytes the L2 tier may hold (0 = not bounded by kvdock).", "index", "type"),
		tierObjects:      d("kvdock_tier_objects", "Chunks the L2 tier holds.", "index", "type"),
		tierQueue:        d("kvdock_tier_queue_depth", "Chunks queued for writing to the L2 tier.", "index", "type"),
		tierQueueBytes:   d("kvdock_tier_queue_bytes", "Bytes queued for writing to the L2 tier.", "index", "type"),
		tierHits:         d("kvdock_tier_hits_total", "Chunks found in the L2 tier.", "index", "type"),
		tierMisses:       d("kvdock_tier_misses_total", "Chunks looked for and not found in the L2 tier.", "index", "type"),
		tierCorrupt:      d("kvdock_tier_corrupt_total", "L2 tier values rejected by their header or checksum (never served).", "index", "type"),
		tierDropped:      d("kvdock_tier_dropped_writes_total", "Writes to the L2 tier dropped because it fell behind or failed.", "index", "type"),
		tierRead:         d("kvdock_tier_read_bytes_total", "Bytes read from the L2 tier.", "index", "type"),
		tierWrite:        d("kvdock_tier_write_bytes_total", "Bytes written to the L2 tier.", "index", "type"),
		tierLoads:        d("kvdock_tier_loads_total", "Prefetch loads from the L2 tier into L1.", "index", "type"),
		tierLoadTimeouts: d("kvdock_tier_load_timeouts_total", "Prefetch loads from the L2 tier given up at the load timeout.", "index", "type"),
		misses:           newMissDescs(),
		whatif:           newWhatIfDescs(),
		restart:          newRestartDescs(),
		protocol:         newProtocolDescs(),
		kvEvents:         newKVEventsDescs(),
		counters:         map[string]*counter{},
		ctx:              map[ctxKey]ctxBytes{},
		bytes:            map[[2]string]float64{},
	}
}

func (c *snapshotCollector) setSource(src Source) {
	c.mu.Lock()
	c.src = src
	c.mu.Unlock()
}

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.memUsed, c.usageRatio, c.capacity, c.objects, c.activeJobs, c.resident, c.usable, c.usableRatio,
		c.l1Read, c.l1Write, c.l1Evicted, c.l1AllocFail, c.l1Ticks, c.lookupReq, c.lookupHit, c.lookups,
		c.transferBytes, c.contexts, c.badInput, c.contextStates, c.lastSeen, c.reaped, c.removed, c.reused, c.gpuUsed, c.gpuTotal, c.up, c.sessions, c.inFlight,
		c.tierUp, c.tierState, c.tierUsed, c.tierCapacity, c.tierObjects, c.tierQueue, c.tierQueueBytes,
		c.tierHits, c.tierMisses, c.tierCorrupt, c.tierDropped, c.tierRead, c.tierWrite,
		c.tierLoads, c.tierLoadTimeouts} {
		ch <- d
	}
	c.misses.describe(ch)
	c.whatif.describe(ch)
	c.restart.describe(ch)
	c.protocol.describe(ch)
	c.kvEvents.describe(ch)
	c.m.requests.Describe(ch)
	c.m.duration.Describe(ch)
	c.rates.describe(ch)
}

// modeLabel is the metric label of a transfer mode.
func modeLabel(m workers.Mode) string {
	if m == workers.ModeSHM {
		return "shm"
	}
	return "pickle"
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.m.duration.Collect(ch)
	defer c.m.requests.Collect(ch)
	if c.src == nil {
		return
	}
	s := c.src.Snapshot()

	names := make([]string, 0, len(s.Requests.Requests))
	for n := range s.Requests.Requests {
		names = append(names, n)
	}
	c.m.prime(names)

	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	count := func(d *prometheus.Desc, key string, raw float64, labels ...string) {
		k, ok := c.counters[key]
		if !ok {
			k = &counter{}
			c.counters[key] = k
		}
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, k.observe(raw), labels...)
	}

	up := 0.0
	if s.Healthy() {
		up = 1
	}
	gauge(c.up, up)
	p := s.Pool.Stats
	gauge(c.memUsed, float64(p.UsedBytes))
	ratio := 0.0
	if p.Size > 0 {
		ratio = float64(p.UsedBytes) / float64(p.Size)
	}
	gauge(c.usageRatio, ratio)
	gauge(c.capacity, float64(p.Size))
	gauge(c.objects, float64(p.Objects))
	gauge(c.resident, float64(p.ResidentBytes))
	gauge(c.usable, float64(p.UsableBytes))
	gauge(c.usableRatio, p.UsableRatio())
	gauge(c.activeJobs, float64(s.Lookup.ActiveJobs))
	gauge(c.sessions, float64(s.Sessions))
	gauge(c.inFlight, float64(s.Requests.InFlight))

	count(c.l1Read, "l1_read", float64(p.ReadHits))
	count(c.l1Write, "l1_write", float64(p.WriteReservations))
	count(c.l1Evicted, "l1_evicted", float64(p.Evictions))
	count(c.l1AllocFail, "l1_alloc_fail", float64(p.AllocFailures))
	count(c.l1Ticks, "l1_ticks", float64(p.EvictionTicks))
	count(c.lookupReq, "lookup_req", float64(s.Lookup.RequestedTokens))
	count(c.lookupHit, "lookup_hit", float64(s.Lookup.HitTokens))
	count(c.lookups, "lookups", float64(s.Lookup.Lookups))
	c.collectMisses(s.Misses, count)
	c.protocol.collect(s, count)

	kinds := badKinds()
	for k := range s.Requests.BadInput {
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	for _, k := range kinds {
		count(c.badInput, "bad|"+k, float64(s.Requests.BadInput[k]), k)
	}

	c.rates.collect(s, ch)
	c.collectContexts(s.Contexts, gauge)
	byState := map[workers.State]int{}
	for _, ci := range s.Contexts {
		byState[ci.State]++
		if ci.State == workers.StateActive || ci.State == workers.StateIdle {
			gauge(c.lastSeen, s.Taken.Sub(ci.LastRequest).Seconds(), strconv.FormatInt(ci.InstanceID, 10))
		}
	}
	for _, st := range workers.States() {
		gauge(c.contextStates, float64(byState[st]), string(st))
	}
	count(c.reaped, "reaped", float64(s.Transfer.Reaped))
	count(c.removed, "removed", float64(s.Transfer.Removed))
	count(c.reused, "reused", float64(s.Transfer.Reused))
	c.whatif.collect(s.WhatIf, gauge)
	c.restart.collect(s.Restart, gauge)
	for _, mode := range [...]string{"shm", "pickle"} {
		for _, dir := range [...]string{"in", "out"} {
			ch <- prometheus.MustNewConstMetric(c.transferBytes, prometheus.CounterValue, c.bytes[[2]string{mode, dir}], mode, dir)
		}
	}

	for _, t := range s.Tiers {
		idx := strconv.Itoa(t.Index)
		up := 0.0
		if t.State != tierstate.Down {
			up = 1
		}
		gauge(c.tierUp, up, idx, t.Type)
		for _, st := range [...]tierstate.State{tierstate.Up, tierstate.Down, tierstate.Degraded} {
			v := 0.0
			if t.State == st {
				v = 1
			}
			gauge(c.tierState, v, idx, t.Type, string(st))
		}
		gauge(c.tierUsed, float64(t.UsedBytes), idx, t.Type)
		gauge(c.tierCapacity, float64(t.CapacityBytes), idx, t.Type)
		gauge(c.tierObjects, float64(t.Objects), idx, t.Type)
		gauge(c.tierQueue, float64(t.QueueDepth), idx, t.Type)
		gauge(c.tierQueueBytes, float64(t.QueueBytes), idx, t.Type)
		// Keyed by position and type: a restart that reorders the tiers
		// starts fresh series rather than mixing two tiers' totals.
		key := "tier|" + idx + "|" + t.Type + "|"
		count(c.tierHits, key+"hits", float64(t.Hits), idx, t.Type)
		count(c.tierMisses, key+"misses", float64(t.Misses), idx, t.Type)
		count(c.tierCorrupt, key+"corrupt", float64(t.Corrupt), idx, t.Type)
		count(c.tierDropped, key+"dropped", float64(t.DroppedWrites), idx, t.Type)
		count(c.tierRead, key+"read", float64(t.ReadBytes), idx, t.Type)
		count(c.tierWrite, key+"write", float64(t.WriteBytes), idx, t.Type)
		count(c.tierLoads, key+"loads", float64(t.Loads), idx, t.Type)
		count(c.tierLoadTimeouts, key+"load_timeouts", float64(t.LoadTimeouts), idx, t.Type)
	}

	c.collectKVEvents(s.KVEvents, gauge, count)
	if s.GPU.Available {
		for _, d := range s.GPU.Devices {
			idx := strconv.Itoa(d.Index)
			gauge(c.gpuUsed, float64(d.MemUsed), idx, d.Name)
			gauge(c.gpuTotal, float64(d.MemTotal), idx, d.Name)
		}
	}
}

// collectContexts counts contexts by mode and adds each registration's byte
// increase since the last scrape to the totals of its current mode, so the
// totals survive unregistration and never go down.
func (c *snapshotCollector) collectContexts(ctxs []workers.ContextInfo, gauge func(*prometheus.Desc, float64, ...string)) {
	byMode := map[string]int{"shm": 0, "pickle": 0}
	seen := make(map[ctxKey]ctxBytes, len(ctxs))
	for _, ci := range ctxs {
		mode := modeLabel(ci.Mode)
		if ci.State != workers.StateReaped && ci.State != workers.StateRemoved {
			byMode[mode]++
		}
		k := ctxKey{ci.InstanceID, ci.Registered}
		prev := c.ctx[k]
		if d := ci.BytesIn - prev.in; d > 0 {
			c.bytes[[2]string{mode, "in"}] += float64(d)
		}
		if d := ci.BytesOut - prev.out; d > 0 {
			c.bytes[[2]string{mode, "out"}] += float64(d)
		}
		seen[k] = ctxBytes{ci.BytesIn, ci.BytesOut}
	}
	c.ctx = seen
	for _, mode := range [...]string{"shm", "pickle"} {
		gauge(c.contexts, float64(byMode[mode]), mode)
	}
}
