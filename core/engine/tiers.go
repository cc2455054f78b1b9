package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/layout"
	"kvdock/core/tierstate"
	"kvdock/settings"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/fs"
	"kvdock/transfer/tier/resp"
)

// EventTier is the kind of the tier events: a tier going down (with the
// reason), degraded, or back up.
const EventTier EventKind = "tier"

// tierOpenTimeout bounds opening the backends of a config (a backend that
// cannot reach its server opens down and reconnects by itself).
const tierOpenTimeout = 10 * time.Second

// tierOpeners are the backend constructors by adapter "type": the ones of
// Options.TierOpeners (tests) over the built-in fs and resp backends. There
// is no package-level registry.
func (e *Engine) tierOpeners() map[string]tier.Opener {
	m := map[string]tier.Opener{
		"fs": func(_ context.Context, adapter settings.Adapter, log *slog.Logger) (tier.Backend, error) {
			cfg, err := fs.FromAdapter(adapter.FS)
			if err != nil {
				return nil, err
			}
			return fs.Open(cfg, log)
		},
		"resp": func(ctx context.Context, adapter settings.Adapter, log *slog.Logger) (tier.Backend, error) {
			return resp.Open(ctx, resp.FromAdapter(adapter.RESP), log)
		},
	}
	for typ, open := range e.opts.TierOpeners {
		m[typ] = open
	}
	return m
}

// tiers holds the running tier set of a plane. A restart that changes the
// l2 settings swaps the set and keeps the pool; lookups and commits reach the
// set through it, so they always see the current one.
type tiers struct {
	mu   sync.Mutex
	cfg  settings.L2Config
	set  *tier.Set // nil without adapters
	done chan struct{}
}

// Benchmark traffic (keys.IsBenchModel) never reaches a tier: its chunks
// are not written behind (they would take the real workers' place there)
// and its lookups load nothing from a tier into the pool.

// Prefetch is lookup.Tiers over the current set.
func (t *tiers) Prefetch(ctx context.Context, model string, ws int, ks []keys.ObjectKey, per, count int) int {
	if s := t.current(); s != nil && !keys.IsBenchModel(model) {
		return s.Prefetch(ctx, model, ws, ks, per, count)
	}
	return 0
}

// KnownAbsent is lookup.TiersKnownAbsent over the current set.
func (t *tiers) KnownAbsent(model string, ws int, ks []keys.ObjectKey, per int) bool {
	if s := t.current(); s != nil && !keys.IsBenchModel(model) {
		return s.KnownAbsent(model, ws, ks, per)
	}
	return true
}

// Enqueue is nongpu's Published hook over the current set.
func (t *tiers) Enqueue(ks []keys.ObjectKey, lay layout.Layout) {
	if s := t.current(); s != nil && (len(ks) == 0 || !keys.IsBenchModel(ks[0].Model)) {
		s.Enqueue(ks, lay)
	}
}

func (t *tiers) current() *tier.Set {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.set
}

// Stats is the current set's snapshot (nil without tiers).
func (t *tiers) Stats() []tierstate.Tier {
	if s := t.current(); s != nil {
		return s.Stats()
	}
	return nil
}

// buildTiers opens cfg's adapters over pool; nil without adapters. With
// the KV event stream on (kv), the tiers tell kv's medium of each tier
// what they hold, and their loads into L1.
func (e *Engine) buildTiers(cfg settings.L2Config, pool tier.Pool, layouts tier.Layouts, kv *kvevents.Tracker) (*tier.Set, error) {
	if len(cfg.Adapters) == 0 {
		if kv != nil {
			kv.SetTiers(nil) // the tiers' media go with them
		}
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), tierOpenTimeout)
	defer cancel()
	log := e.log.With("component", "tiers")
	bs, err := tier.OpenAll(ctx, cfg.Adapters, e.tierOpeners(), log)
	if err != nil {
		return nil, fmt.Errorf("L2 tiers: %w", err)
	}
	opts := tier.Options{
		StorePolicy: cfg.StorePolicy,
		QueueBytes:  cfg.QueueBytes,
		MaxInFlight: cfg.PrefetchMaxInFlight,
		LoadTimeout: time.Duration(cfg.LoadTimeoutSeconds * float64(time.Second)),
		Logger:      log,
		StateChanged: func(st tierstate.Tier) {
			e.events.add(EventTier, tierLevel(st.State), tierMessage(st))
		},
		LastRequest: e.lastRequest,
	}
	if kv != nil {
		media := make([]string, len(cfg.Adapters))
		for i, a := range cfg.Adapters {
			media[i] = a.KVEventsMedium()
		}
		v := kv.SetTiers(media)
		opts.Contents = func(i int, k keys.ObjectKey, present bool) {
			if present {
				v.Stored(i, &k)
			} else {
				v.Lost(i, &k)
			}
		}
		opts.Loaded = kv.Loaded
	}
	s := tier.NewSet(bs, pool, layouts, opts)
	for i, st := range s.Stats() {
		e.events.add(EventTier, tierLevel(st.State), fmt.Sprintf("tier %d (%s %s) opened: %s", i, st.Type, st.Target, stateText(st)))
	}
	return s, nil
}

func tierLevel(s tierstate.State) slog.Level {
	if s == tierstate.Up {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

func stateText(st tierstate.Tier) string {
	if st.Reason == "" {
		return string(st.State)
	}
	return fmt.Sprintf("%s (%s)", st.State, st.Reason)
}

func tierMessage(st tierstate.Tier) string {
	return fmt.Sprintf("tier %d (%s %s) is %s", st.Index, st.Type, st.Target, stateText(st))
}

// swap makes s (built for cfg) the running set and stops the old one: its
// jobs and writes end, its backends close.
func (t *tiers) swap(cfg settings.L2Config, s *tier.Set) {
	var done chan struct{}
	if s != nil {
		done = make(chan struct{})
		go func() {
			s.Run(context.Background())
			close(done)
		}()
	}
	t.mu.Lock()
	old, oldDone := t.set, t.done
	t.cfg, t.set, t.done = cfg, s, done
	t.mu.Unlock()
	if old != nil {
		_ = old.Close()
		<-oldDone
	}
}

// close stops the running set and closes its backends.
func (t *tiers) close() {
	t.swap(settings.L2Config{}, nil)
}

// applyTiersLocked rebuilds the plane's tier set when the l2 settings
// changed; on failure the running set stays and the event says why.
func (e *Engine) applyTiersLocked(cfg settings.L2Config) {
	p := e.dataPlane
	if p == nil {
		return
	}
	p.tiers.mu.Lock()
	same := reflect.DeepEqual(p.tiers.cfg, cfg)
	p.tiers.mu.Unlock()
	if same {
		return
	}
	s, err := e.buildTiers(cfg, p.pool, p.layouts, p.kv)
	if err != nil {
		e.events.add(EventError, slog.LevelError, "L2 tiers not changed: "+err.Error())
		return
	}
	p.tiers.swap(cfg, s)
	e.events.add(EventTier, slog.LevelInfo, fmt.Sprintf("L2 tiers now %d (pool kept)", len(cfg.Adapters)))
}

// lastRequest is when the wire server last saw a message (the zero time
// while none serves): the tiers' writers yield to the request path.
func (e *Engine) lastRequest() time.Time {
	if c := e.cur.Load(); c != nil && c.wireServer != nil {
		return c.wireServer.srv.LastMessage()
	}
	return time.Time{}
}

// tierCallTimeout bounds a listing or a clear of one tier.
const tierCallTimeout = 30 * time.Second

// TierCleared is what a clear of one tier removed.
type TierCleared struct {
	Index          int
	Type, Target   string
	Objects, Bytes int64
}

// TierKeys lists up to limit of tier i's own keys (most recently used
// first) and how many it holds.
func (e *Engine) TierKeys(ctx context.Context, i, limit int) ([]string, int64, error) {
	p := e.cur.Load().dataPlane
	if p == nil || !p.gate.enter() {
		return nil, 0, errNotRunning
	}
	defer p.gate.exit()
	s := p.tiers.current()
	if s == nil {
		return nil, 0, errors.New("no L2 tier is configured")
	}
	ctx, cancel := context.WithTimeout(ctx, tierCallTimeout)
	defer cancel()
	return s.Keys(ctx, i, limit)
}

// ClearTier removes tier i's own objects (kvdock's files or keys, nothing
// else where the tier lives) and records who did it.
func (e *Engine) ClearTier(ctx context.Context, i int, by ClearOrigin) (TierCleared, error) {
	p := e.cur.Load().dataPlane
	if p == nil || !p.gate.enter() {
		return TierCleared{}, errNotRunning
	}
	defer p.gate.exit()
	s := p.tiers.current()
	if s == nil {
		return TierCleared{}, errors.New("no L2 tier is configured")
	}
	ctx, cancel := context.WithTimeout(ctx, tierCallTimeout)
	defer cancel()
	n, b, err := s.Clear(ctx, i)
	c := TierCleared{Index: i, Objects: n, Bytes: b}
	if sts := s.Stats(); i >= 0 && i < len(sts) {
		c.Type, c.Target = sts[i].Type, sts[i].Target
	}
	if err != nil {
		e.events.add(EventTier, slog.LevelWarn, fmt.Sprintf("tier %d (%s) clear by %s failed after %d objects: %v", i, c.Type, by, n, err))
		return c, err
	}
	e.events.add(EventTier, slog.LevelInfo, fmt.Sprintf("tier %d (%s %s) cleared by %s: %d objects, %s removed", i, c.Type, c.Target, by, n, settings.BytesText(b)))
	return c, nil
}

// MaxTierKeys bounds the keys one TierKeys call returns.
const MaxTierKeys = tier.MaxListKeys
