package engine

import (
	"errors"
	"log/slog"
	"os"
	"time"

	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/l1"
	"kvdock/core/restart"
	"kvdock/settings"
	"kvdock/transfer/tier"
)

// newKVTracker returns the tracker of the announced set, nil when neither
// the KV event stream nor the poll log is on, and the poll log, nil when it
// is off. They live with the data plane: they mirror the pool, and a new
// pool starts a new stream (seq 0, which a router takes as a reset of the
// pod) and a new log (seq from 1 under a new incarnation, which LMCache's
// poller takes as a restart of the server).
func newKVTracker(cfg settings.Config) (*kvevents.Tracker, *kvevents.Log) {
	c := cfg.KVEvents
	var log *kvevents.Log
	if c.LogSize > 0 {
		// Wall-clock nanoseconds, as upstream's time.time_ns(): differs
		// from every earlier process's and plane's.
		log = kvevents.NewLog(c.LogSize, cfg.Server.ChunkSize, time.Now().UnixNano())
	}
	if c.Endpoint == "" && log == nil {
		return nil, nil
	}
	return kvevents.New(kvevents.Options{
		Medium: c.MediumL1, BlockSize: cfg.Server.ChunkSize, EventBlockSize: c.BlockSize, Array: c.Encoding == "array",
		BufferSteps: c.BufferSteps, Log: log, NoStream: c.Endpoint == "",
	}), log
}

// startKVPublisher binds (or connects) the stream's sockets.
func startKVPublisher(cfg settings.Config, kv *kvevents.Tracker, log *slog.Logger) (*kvevents.Publisher, error) {
	c := cfg.KVEvents
	pod := c.Pod
	if pod == "" {
		pod, _ = os.Hostname()
	}
	pub, err := kvevents.Start(kv, kvevents.PublisherOptions{
		Endpoint: c.Endpoint, Connect: c.Connect, ReplayEndpoint: c.ReplayEndpoint,
		LegacyReplay: c.ReplayFormat == "legacy", Pod: pod, Logger: log.With("component", "kvevents"),
	})
	if err != nil {
		return nil, err
	}
	log.Info("KV events", "endpoint", c.Endpoint, "connect", c.Connect, "replay", c.ReplayEndpoint, "pod", pod,
		"encoding", c.Encoding, "medium", c.MediumL1)
	return pub, nil
}

// kvFile is the file beside the restart record that carries the KV event
// stream's chunk descriptions to the process that adopts the pool.
func kvFile(record string) string { return record + ".kvevents" }

// describeKV writes what the next process needs to re-announce the pool
// it adopts (kvevents.Tracker.DescribeTo's description) beside the
// record, streamed into a file that is not in place until placeKV puts
// it there; a failure costs only the re-announcement, never the handover.
func (e *Engine) describeKV(kv *kvevents.Tracker, dir, record string, stamp int64, tiers [][]keys.ObjectKey) keptKV {
	f, err := restart.Create(dir, kvFile(record))
	if err != nil {
		return keptKV{err: err}
	}
	left, err := kv.DescribeTo(f, stamp, kvevents.MaxDescribeBytes, tiers)
	return keptKV{file: f, left: left, err: err}
}

// keptKV is a description describeKV wrote.
type keptKV struct {
	file *restart.Pending
	left int // records past the bound, left out
	err  error
}

// placeKV puts the description in place once the record it goes with is
// written (recorded), and removes it otherwise.
func (e *Engine) placeKV(k keptKV, recorded bool) {
	if k.err == nil && recorded {
		k.err = k.file.Commit()
	} else if k.file != nil {
		k.file.Abort()
	}
	switch {
	case !recorded:
	case k.err != nil:
		e.log.Warn("stop: KV event chunks not carried: the next process announces what it stores", "err", k.err)
	case k.left > 0:
		e.log.Warn("stop: KV event records past the description's bound are not re-announced", "left_out", k.left)
	}
}

// reannounceKV, over an adopted pool, returns what re-announces the
// adopted usable set from the description the previous process left, and
// has the tiers (set, nil without) adopt the objects it carried for them,
// which are re-announced for their media as each tier tells it still holds
// them; nil when there is nothing to re-announce. It holds the tracker
// (kvevents.Tracker.Hold) until that ran, so the plane can serve meanwhile:
// the data path's changes wait behind the re-announcement, which leads the
// new stream. Re-announcing tens of thousands of chunks (their tokens
// decoded, their hash chains checked) takes a few hundred ms
// (BenchmarkRestart64k in core/kvevents), which the restart's gap need not
// wait for. The description is consumed in any case, so a later start
// never reads a stale one.
func (e *Engine) reannounceKV(cfg settings.Config, kv *kvevents.Tracker, a *adoption) func(pool *l1.Pool, set *tier.Set) {
	if a == nil {
		return nil
	}
	kept, stoppedAt := a.kvKept, a.stoppedAt
	a.kvKept = nil
	dir, record, err := e.stateFile(cfg)
	if err != nil {
		return nil
	}
	if kv == nil || a.cold {
		_, _ = restart.TakeFile(dir, kvFile(record), kvevents.MaxDescribeBytes)
		return nil
	}
	kv.Hold()
	return func(pool *l1.Pool, set *tier.Set) {
		defer kv.Release()
		data, err := restart.TakeFile(dir, kvFile(record), kvevents.MaxDescribeBytes)
		if errors.Is(err, restart.ErrNone) {
			return
		}
		if err != nil {
			e.log.Warn("restart: KV event chunks not re-announced", "err", err)
			return
		}
		start := e.opts.Now()
		r, err := kv.Reannounce(data, stoppedAt.UnixNano(), keptPublished(kept), pool.Unreadable)
		if err != nil {
			e.log.Warn("restart: KV event chunks not re-announced", "err", err)
			return
		}
		if r.Dropped > 0 {
			e.log.Warn("restart: KV event chunk descriptions left out", "dropped", r.Dropped)
		}
		adopted := 0
		if set != nil {
			for i, ks := range r.Tiers {
				adopted += set.Adopt(i, ks)
			}
		}
		e.log.Info("restart: KV event chunks re-announced", "chunks", r.Chunks, "described", r.Described,
			"tier_objects", r.TierObjects, "tier_objects_adopted", adopted, "took", e.opts.Now().Sub(start))
	}
}

// kvCommitted is the transfer module's commit hook, nil when the stream is
// off.
func (p *dataPlane) kvCommitted() func(kvevents.Commit) {
	if p.kv == nil {
		return nil
	}
	return p.kv.Commit
}

// closeKV stops the publisher.
func (p *dataPlane) closeKV() {
	if p.kvPub != nil {
		p.kvPub.Close()
	}
}

// KVEventsStatus is the /status kv_events block.
type KVEventsStatus struct {
	Enabled        bool   `json:"enabled"`
	Endpoint       string `json:"endpoint,omitempty"`
	Connect        bool   `json:"connect,omitempty"`
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	Announced      int    `json:"announced"`
	Held           int    `json:"held"`
	Batches        uint64 `json:"batches"`
	StoredEvents   uint64 `json:"stored_blocks"`
	RemovedEvents  uint64 `json:"removed_blocks"`
	Dropped        uint64 `json:"dropped"`
	Queued         int    `json:"queued"`
	Buffered       int    `json:"buffered_batches"`
	BufferedBytes  int    `json:"buffered_bytes"`
	BufferTrimmed  uint64 `json:"buffer_trimmed"`
	NextSeq        uint64 `json:"next_seq"`
	Sent           uint64 `json:"sent"`
	SendErrors     uint64 `json:"send_errors"`
	ReplayRequests uint64 `json:"replay_requests"`
	ReplayBad      uint64 `json:"replay_bad"`
	ReplayBatches  uint64 `json:"replay_batches"`
	// Log is LMCache's poll channel (POLL_KV_EVENTS), on or off apart
	// from the stream.
	Log KVEventLogStatus `json:"log"`
}

// KVEventLogStatus is the poll log's block of /status kv_events, named as
// upstream's report_status names the same figures where it has them.
type KVEventLogStatus struct {
	Enabled     bool   `json:"enabled"`
	Incarnation int64  `json:"incarnation,omitempty"`
	Depth       int    `json:"log_depth"`
	Bytes       int    `json:"log_bytes"`
	Capacity    int    `json:"log_capacity"`
	NextSeq     uint64 `json:"next_seq"`
	Trimmed     uint64 `json:"trimmed"`
	Polls       uint64 `json:"polls"`
	LostAnswers uint64 `json:"lost_answers"`
}

// kvStatus reads the stream's counters and the poll log's.
func (p *dataPlane) kvStatus(cfg settings.Config) KVEventsStatus {
	if p == nil || p.kv == nil {
		return KVEventsStatus{}
	}
	var lg KVEventLogStatus
	if p.kvLog != nil {
		ls := p.kvLog.Stats()
		lg = KVEventLogStatus{Enabled: true, Incarnation: ls.Incarnation, Depth: ls.Depth, Bytes: ls.Bytes, Capacity: ls.Capacity,
			NextSeq: ls.NextSeq, Trimmed: ls.Trimmed, Polls: ls.Polls, LostAnswers: ls.LostAnswers}
	}
	if cfg.KVEvents.Endpoint == "" {
		return KVEventsStatus{Log: lg}
	}
	s := p.kv.Stats()
	out := KVEventsStatus{Log: lg, Enabled: true, Endpoint: cfg.KVEvents.Endpoint, Connect: cfg.KVEvents.Connect,
		ReplayEndpoint: cfg.KVEvents.ReplayEndpoint, Announced: s.Announced, Held: s.Held, Batches: s.Batches,
		StoredEvents: s.StoredEvents, RemovedEvents: s.RemovedEvents, Dropped: s.Dropped, Queued: s.Queued,
		Buffered: s.Buffered, BufferedBytes: s.BufferedBytes, BufferTrimmed: s.BufferTrimmed, NextSeq: s.NextSeq}
	if p.kvPub != nil {
		ps := p.kvPub.Stats()
		out.Sent, out.SendErrors, out.ReplayRequests, out.ReplayBad, out.ReplayBatches =
			ps.Sent, ps.SendErrors, ps.ReplayRequests, ps.ReplayBad, ps.ReplayBatches
	}
	return out
}

// keptPublished is the keys of the kept objects that were published when
// kept: neither held nor a write reservation.
func keptPublished(kept []l1.KeptObject) []keys.ObjectKey {
	n := 0
	for _, o := range kept {
		if !o.Held && !o.Write {
			n++
		}
	}
	out := make([]keys.ObjectKey, 0, n)
	for _, o := range kept {
		if !o.Held && !o.Write {
			out = append(out, o.Key)
		}
	}
	return out
}
