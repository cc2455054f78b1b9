package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvdock/core/engine"
)

// kvEventsDescs are the KV event stream's metrics (docs/EVENTS.md), present
// only while the stream is on, and the poll log's, present while it is on.
type kvEventsDescs struct {
	announced, held, batches, stored, removed, dropped, replays *prometheus.Desc
	logDepth, logTrimmed, logPolls, logLost                     *prometheus.Desc
}

func newKVEventsDescs() kvEventsDescs {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return kvEventsDescs{
		announced: d("kvdock_kv_events_announced_chunks", "Chunks announced to routers now (the usable set of L1)."),
		held:      d("kvdock_kv_events_held_chunks", "Whole chunks held back from routers until their parent is announced."),
		batches:   d("kvdock_kv_events_batches_total", "KV event batches published."),
		stored:    d("kvdock_kv_events_stored_blocks_total", "Blocks announced stored (BlockStored hashes)."),
		removed:   d("kvdock_kv_events_removed_blocks_total", "Blocks announced removed (BlockRemoved hashes)."),
		dropped:   d("kvdock_kv_events_dropped_total", "KV events dropped because the publisher's queue was full."),
		replays:   d("kvdock_kv_events_replay_requests_total", "Replay requests answered."),
		logDepth:  d("kvdock_kv_events_log_depth", "Records kept in the POLL_KV_EVENTS log."),
		logTrimmed: d("kvdock_kv_events_log_trimmed_total",
			"POLL_KV_EVENTS records overwritten by newer ones (a poller behind them is told lost)."),
		logPolls: d("kvdock_kv_events_log_polls_total", "POLL_KV_EVENTS requests answered from the log."),
		logLost:  d("kvdock_kv_events_log_lost_answers_total", "POLL_KV_EVENTS answers with lost=true."),
	}
}

func (d kvEventsDescs) describe(ch chan<- *prometheus.Desc) {
	for _, x := range []*prometheus.Desc{d.announced, d.held, d.batches, d.stored, d.removed, d.dropped, d.replays,
		d.logDepth, d.logTrimmed, d.logPolls, d.logLost} {
		ch <- x
	}
}

// collectKVEvents emits the stream's figures when it is on, and the poll
// log's when it is.
func (c *snapshotCollector) collectKVEvents(s engine.KVEventsStatus, gauge func(*prometheus.Desc, float64, ...string),
	count func(*prometheus.Desc, string, float64, ...string)) {
	d := c.kvEvents
	if l := s.Log; l.Enabled {
		gauge(d.logDepth, float64(l.Depth))
		count(d.logTrimmed, "kv_events|log_trimmed", float64(l.Trimmed))
		count(d.logPolls, "kv_events|log_polls", float64(l.Polls))
		count(d.logLost, "kv_events|log_lost", float64(l.LostAnswers))
	}
	if !s.Enabled {
		return
	}
	gauge(d.announced, float64(s.Announced))
	gauge(d.held, float64(s.Held))
	count(d.batches, "kv_events|batches", float64(s.Batches))
	count(d.stored, "kv_events|stored", float64(s.StoredEvents))
	count(d.removed, "kv_events|removed", float64(s.RemovedEvents))
	count(d.dropped, "kv_events|dropped", float64(s.Dropped))
	count(d.replays, "kv_events|replays", float64(s.ReplayRequests))
}
