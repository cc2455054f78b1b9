package engine

import (
	"context"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/gpu"
	"kvdock/core/hostmem"
	"kvdock/core/l1"
	"kvdock/core/lookup"
	"kvdock/core/misses"
	"kvdock/core/rpc"
	"kvdock/core/tierstate"
	"kvdock/core/whatif"
	"kvdock/core/workers"
	"kvdock/settings"
)

// GPUSampler is the GPU telemetry the engine samples off the UI goroutine.
type GPUSampler interface {
	Run(ctx context.Context, every time.Duration)
	Latest() gpu.Snapshot
	SetInterval(every time.Duration)
}

// Pool is the pool part of a snapshot.
type Pool struct {
	l1.Stats
	// Decision is how the pool was built: segment or anonymous, and why.
	Decision l1.Decision
	// ShmFree is /dev/shm's free space now (-1 when it cannot be read).
	ShmFree int64
	// HostAvailable is the host's MemAvailable now (-1 when it cannot be
	// read): what a private (SHM off) pool draws on.
	HostAvailable int64
}

// Snapshot is an immutable picture of the engine for the faces: nothing in
// it is shared with the running engine.
type Snapshot struct {
	Version  string
	State    State
	Error    string
	Endpoint string
	Protocol string
	Started  time.Time
	Uptime   time.Duration
	Taken    time.Time

	Config  settings.Config
	Sources map[string]settings.Source

	// Shm is what registration advertises, with the reason.
	Shm      workers.Info
	Pool     Pool
	Contexts []workers.ContextInfo
	Transfer workers.Stats
	// Liveness is the worker reaper's settings in force.
	Liveness workers.Liveness
	Requests rpc.Stats
	Lookup   lookup.Stats
	// Misses says why lookups missed, per context and in total.
	Misses misses.Report
	// Host is the host's RAM and which NUMA nodes hold the pool's pages.
	Host     hostmem.Host
	Sessions int
	Events   []Event
	GPU      gpu.Snapshot
	// Rebuilt is the last pool rebuild (zero when none happened).
	Rebuilt Rebuilt
	// Restart is this start's adoption of the previous process's pool.
	Restart Restart
	// Tiers are the L2 tiers in lookup order (empty when none is configured).
	Tiers []tierstate.Tier
	// Rates is the recent history of the rates, sampled once a second.
	Rates Rates
	// WhatIf is the estimated hit ratio at other pool sizes (empty points
	// until lookups were seen).
	WhatIf whatif.Curve
	// Stats says what the insight figures (hit ratio, tokens saved, miss
	// breakdown, what-if) cover.
	Stats StatsWindow
	// Unregistered are models that lookups named with no worker registered
	// (each answered 0), most recent first.
	Unregistered []lookup.Unregistered
	// KVEvents is the KV event stream for routers (Enabled false when off).
	KVEvents KVEventsStatus
}

// Rebuilt says when the pool was last rebuilt and how many registered
// worker contexts that dropped (each worker must register again).
type Rebuilt struct {
	At              time.Time
	DroppedContexts int
}

// Healthy reports whether the engine is serving.
func (s Snapshot) Healthy() bool { return s.State == Serving }

// Snapshot returns the engine's state now. It is cheap enough for a 1 s tick.
func (e *Engine) Snapshot() Snapshot {
	c := e.cur.Load()
	cfg, src, p, f := c.cfg, c.sources, c.dataPlane, c.wireServer

	now := e.opts.Now()
	e.st.RLock()
	s := Snapshot{
		Version: e.opts.Version,
		State:   e.state,
		Error:   e.lastErr,
		Started: e.started,
		Taken:   now,
		Config:  cfg,
		Rebuilt: e.rebuilt,
		Restart: e.restart,
	}
	e.st.RUnlock()
	s.Restart.Refused = append([]string(nil), s.Restart.Refused...)
	s.Restart.DropReasons = append([]string(nil), s.Restart.DropReasons...)
	if !s.Started.IsZero() && s.State != Stopped {
		s.Uptime = now.Sub(s.Started)
	}
	s.Sources = make(map[string]settings.Source, len(src))
	for k, v := range src {
		s.Sources[k] = v
	}
	s.Protocol = cfg.Server.Protocol
	s.Pool.ShmFree = shmFree()
	s.Pool.HostAvailable = -1
	if n, err := (hostmem.Probe{}).MemAvailable(); err == nil {
		s.Pool.HostAvailable = n
	}
	s.Host = hostInfo(p)
	if p != nil {
		s.Shm = p.transfer.PoolInfo()
		s.KVEvents = p.kvStatus(cfg)
		s.Pool.Stats = p.pool.Stats()
		s.Pool.Decision = p.pool.Decision()
		s.Contexts = p.transfer.Contexts()
		s.Transfer = p.transfer.Stats()
		s.Liveness = p.transfer.LivenessSettings().Summary()
		s.Lookup = p.lookup.Stats()
		s.Misses = p.lookup.Misses()
		s.Misses.GhostEntries, s.Misses.GhostBytes = p.ghost.Entries(), p.ghost.Bytes()
		s.Sessions = p.sessions.Len()
		s.Tiers = p.tiers.Stats()
		s.WhatIf = p.whatif.Curve()
		s.Unregistered = p.lookup.Unregistered()
	}
	s.Stats = e.rates.statsWindow(s.Started, s.WhatIf.Sampled)
	if f != nil {
		s.Endpoint = f.srv.Endpoint()
		s.Requests = f.srv.Stats()
	}
	s.Events = e.events.recent(100)
	s.Rates = e.rates.window()
	if e.opts.GPU != nil {
		s.GPU = e.opts.GPU.Latest()
	} else {
		s.GPU = gpu.Snapshot{Reason: "GPU telemetry not configured"}
	}
	return s
}

// shmFree is the free space of /dev/shm in bytes, -1 when unknown.
func shmFree() int64 {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * st.Bsize
}

// hostInfo reads the host's RAM and NUMA nodes and, on a host of several
// nodes, where the pool's pages live (p nil: no pool).
func hostInfo(p *dataPlane) hostmem.Host {
	var h hostmem.Host
	m, err := hostmem.ReadMemory("")
	if err != nil {
		h.Memory = hostmem.Memory{Total: -1, Available: -1}
		h.MemoryErr = err.Error()
	} else {
		h.Memory = m
	}
	// A kernel without NUMA has no node list: one node.
	h.Nodes = 1
	if n, err := hostmem.OnlineNodes(""); err == nil {
		h.Nodes = n
	}
	if h.Nodes > 1 {
		if p == nil {
			h.PoolErr = "no pool"
		} else {
			h.Pool, h.PoolErr = p.placement.Read(time.Now(), p.pool.Span)
		}
	}
	return h
}
