package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/lookup"
	"kvdock/core/restart"
	"kvdock/settings"
)

// Restart is the last start's adoption of a kept pool, for the faces.
type Restart struct {
	// Adopted: the pool and registrations of the previous process were
	// adopted; otherwise Reason says why not ("" when there was no record),
	// and Contexts counts the registrations restored over the cold pool
	// (those that need no segment).
	Adopted  bool
	Objects  int   // published objects readable again
	Bytes    int64 // their sizes rounded to the alignment
	Held     int   // objects kept for holders of the previous process until their TTL
	Contexts int   // registrations restored
	Lookups  int   // LOOKUPs answered and not queried, restored for their queries
	// Gap is from the previous process's stop of reading requests to this
	// one's first bind (0 until bound).
	Gap        time.Duration
	Reason     string
	At         time.Time
	Generation uint64 // how many times the pool was handed over
	// Refused lists the registrations not restored, with their reasons.
	Refused []string
	// Dropped counts the parts of the record left out one by one (objects,
	// registrations, lookups, read locks past the caps: see restart.Decode
	// and l1.Adopt); DropReasons gives them by kind.
	Dropped     int
	DropReasons []string

	// StatsCarried: the predecessor's figures were taken over (StatsRule),
	// also when its pool was not adopted. Links are the prompt links
	// restored, LinksDropped those left out (the events say why).
	StatsCarried        bool
	Links, LinksDropped int
	// Transfers are the transfers the previous process prepared (a
	// handover's last answers) restored for their commits here;
	// TransfersRefused those left to their locks' deadlines.
	Transfers, TransfersRefused int
	// HandoverParked and HandoverLost are the previous stop's handover:
	// requests it parked and answered, and requests that arrived after its
	// last answer (never answered).
	HandoverParked, HandoverLost int64
}

// adoption is what a plane built after a restart still has to do: over
// an adopted pool, restore the registrations and lookups; over a cold one
// (cold: the pool was not kept or not adopted), the registrations that
// need no segment.
type adoption struct {
	regs      []restart.Registration
	lookups   []restart.Lookup
	stoppedAt time.Time
	cold      bool
	bound     bool
	// stats are the predecessor's figures (carry.go): its miss breakdown
	// goes to the new plane's lookup module.
	stats *restart.Stats
	// transfers are the prepared transfers whose commits come to this
	// process, their keys hashed with carryKey.
	transfers []restart.Transfer
	carryKey  []byte
	// kvKept are the record's objects, of which the KV event stream
	// re-announces those published when kept: picked out on the
	// re-announcement's goroutine (reannounceKV), not before the server
	// binds, where with 64,000 objects it lengthened the gap.
	kvKept []l1.KeptObject
}

// keptState is what a stop that keeps the pool hands its record beside the
// pool: the registrations, the answered lookups and the carried transfers.
type keptState struct {
	regs      []restart.Registration
	lookups   []restart.Lookup
	transfers []restart.Transfer
	carryKey  []byte
	// tierHeld are the objects each tier held for the KV event stream
	// (tier.Set.Held), carried in its description for the next process
	// to adopt and re-announce.
	tierHeld [][]keys.ObjectKey
}

// restoreTransfers gives the carried transfers back to their instances
// (after restoreRegistrations), then ends the pool's claims.
func (e *Engine) restoreTransfers(p *dataPlane, a *adoption) {
	if a == nil {
		return
	}
	n, refused := p.transfer.RestoreCarried(a.transfers, a.carryKey)
	p.pool.EndClaims()
	for _, r := range refused {
		e.log.Warn("restart: carried transfer not restored", "reason", r)
	}
	e.st.Lock()
	e.restart.Transfers, e.restart.TransfersRefused = n, len(refused)
	e.st.Unlock()
}

// stateFile is the record's directory and file for cfg.
func (e *Engine) stateFile(cfg settings.Config) (dir, file string, err error) {
	dir, err = cfg.Server.StateDirPath(os.Getenv, os.UserHomeDir)
	return dir, restart.FileName(cfg.Server.Host, cfg.Server.Port), err
}

func endpointOf(cfg settings.Config) string {
	return net.JoinHostPort(cfg.Server.Host, strconv.Itoa(cfg.Server.Port))
}

// claimStart takes the start lock of cfg's endpoint (restart.Lock) for a
// start, which holds it from before openPool takes the record until the
// wire server is bound or the start failed: of two kvdocks started at
// once on one kept pool, one adopts and the other is refused here with
// the reason. A state directory the lock cannot be taken in (not ours)
// leaves nothing this start could adopt (Take says why): it goes on
// without the lock.
func (e *Engine) claimStart(cfg settings.Config) (release func(), err error) {
	dir, file, err := e.stateFile(cfg)
	if err != nil {
		return func() {}, nil
	}
	l, err := restart.Lock(dir, file)
	if errors.Is(err, restart.ErrStarting) {
		return nil, fmt.Errorf("%w: it adopts the pool kept for %s, if there is one, and this start stops", err, endpointOf(cfg))
	}
	if err != nil {
		e.log.Debug("restart: start lock not taken", "err", err)
		return func() {}, nil
	}
	return func() {
		if err := l.Release(); err != nil {
			e.log.Warn("restart: start lock not released", "err", err)
		}
	}, nil
}

// openPool opens the pool of cfg: it adopts the pool kept by the previous
// process when a record for this endpoint exists and matches the settings
// (segment name, private or auto, size, alignment) and the segment is the one
// recorded; otherwise it creates one, after removing a kept segment that
// will not be adopted, and still hands on the record's registrations (a
// cold adoption: restoreRegistrations keeps those that need no segment).
// The record is consumed either way.
func (e *Engine) openPool(cfg settings.Config, opts l1.Options) (*l1.Pool, *adoption, error) {
	now := e.opts.Now()
	dir, file, err := e.stateFile(cfg)
	var rec restart.Record
	if err == nil {
		rec, err = restart.Take(dir, file)
	}
	if errors.Is(err, restart.ErrNone) {
		e.setRestart(Restart{})
		pool, err := l1.Open(opts)
		return pool, nil, err
	}
	reason := ""
	var carried *adoption
	switch {
	case err != nil:
		reason = "restart record refused: " + err.Error()
	case rec.Endpoint != endpointOf(cfg) && rec.Pool.Segment.Name == "":
		reason = restart.Match(rec, restart.Want{Endpoint: endpointOf(cfg)})
	case rec.Pool.Segment.Name == "":
		// The previous pool was anonymous memory (or its keep failed): the
		// record carries the registrations alone.
		reason = "the previous process kept no pool, only its registrations"
	default:
		// The plan's file: the shared segment, or the private one of a pool
		// that is not shared (--shm-name ""), kept and adopted the same way.
		want := restart.Want{Endpoint: endpointOf(cfg), Auto: cfg.Server.ShmName == nil, Segment: opts.Plan.File(),
			Size: opts.Size, Align: opts.Align}
		if opts.Plan.File() == "" {
			reason = "this start's pool is anonymous memory (" + opts.Plan.Reason + ")"
		} else {
			reason = restart.Match(rec, want)
		}
		if reason == "" {
			pool, ad, aerr := l1.Adopt(opts, rec.Pool)
			if aerr == nil {
				drops := rec.Dropped
				drops.Merge(ad.Dropped)
				e.carryStats(rec.Stats, true, now)
				e.tellIgnored(rec.Ignored, ad)
				e.setRestart(Restart{Adopted: true, Objects: ad.Objects, Bytes: ad.Bytes, Held: ad.Held,
					At: now, Generation: rec.Generation + 1, Dropped: drops.N, DropReasons: drops.Reasons(),
					StatsCarried: rec.Stats != nil, Links: ad.Links, LinksDropped: ad.LinksDropped,
					HandoverParked: rec.Handover.Parked, HandoverLost: rec.Handover.Lost})
				if rec.Handover.Lost > 0 {
					e.events.add(EventLifecycle, slog.LevelWarn, fmt.Sprintf(
						"restart: %d request(s) reached the previous process after its last answer and went unanswered", rec.Handover.Lost))
				}
				e.log.Info("restart: pool adopted", "segment", rec.Pool.Segment.Name, "objects", ad.Objects, "bytes", ad.Bytes,
					"held", ad.Held, "expired", ad.Expired, "clamped", ad.Clamped, "dropped", drops.N,
					"generation", rec.Generation+1, "written_by", rec.Build)
				if drops.N > 0 {
					e.log.Warn("restart: parts of the record left out", "dropped", drops.N, "reasons", drops.Reasons())
					e.events.add(EventLifecycle, slog.LevelWarn, fmt.Sprintf("restart: %d parts of the record left out: %s",
						drops.N, strings.Join(drops.Reasons(), "; ")))
				}
				a := &adoption{regs: rec.Registrations, lookups: rec.Lookups, stoppedAt: rec.StoppedAt, stats: rec.Stats,
					transfers: rec.Transfers, carryKey: rec.CarryKey, kvKept: rec.Pool.Objects}
				return pool, a, nil
			}
			reason = aerr.Error()
		}
		reason = "kept pool not adopted: " + reason
		// The figures go on as over a rebuild: the record is sound, only
		// its pool is not this start's.
		e.carryStats(rec.Stats, false, now)
		e.tellIgnored(rec.Ignored, l1.Adopted{})
		if gone, _ := l1.RemoveKept(opts.ShmDir, rec.Pool.Segment); gone {
			reason += fmt.Sprintf(" (kept segment %s removed)", rec.Pool.Segment.Name)
		}
	}
	if err == nil && rec.Endpoint == endpointOf(cfg) {
		// Registrations outlive the pool: those that need no segment are
		// restored over the new one.
		carried = &adoption{regs: rec.Registrations, stoppedAt: rec.StoppedAt, cold: true}
	}
	e.setRestart(Restart{Reason: reason, At: now, StatsCarried: err == nil && rec.Stats != nil})
	e.log.Warn("restart: cold start", "reason", reason)
	what := "nothing adopted"
	if carried != nil {
		what = "pool not adopted, registrations that need no segment restored"
	}
	e.events.add(EventLifecycle, slog.LevelWarn, "restart: "+what+": "+reason)
	pool, err := l1.Open(opts)
	if err != nil {
		carried = nil
	}
	return pool, carried, err
}

// restoreRegistrations registers the previous process's workers again:
// over an adopted pool every one, with the lookups it answered and nobody
// queried; over a cold pool the PICKLE ones (the SHM ones map the old
// segment, and its read locks are gone with it).
func (e *Engine) restoreRegistrations(p *dataPlane, a *adoption) {
	if a == nil {
		return
	}
	n, refused := p.transfer.Restore(a.regs, !a.cold)
	for _, r := range refused {
		e.log.Warn("restart: registration not restored", "reason", r)
	}
	if a.cold {
		e.st.Lock()
		e.restart.Contexts, e.restart.Refused = n, refused
		e.st.Unlock()
		return
	}
	as := make([]lookup.Answer, len(a.lookups))
	for i, l := range a.lookups {
		as[i] = lookup.Answer{RequestID: l.RequestID, HitChunks: l.HitChunks, Created: l.Created}
	}
	if a.stats != nil {
		p.lookup.CarryMisses(carriedMisses(a.stats.Misses))
	}
	nl, err := p.lookup.Restore(as)
	if err != nil {
		e.log.Warn("restart: lookups not restored", "err", err)
	}
	e.st.Lock()
	e.restart.Contexts, e.restart.Refused, e.restart.Lookups = n, refused, nl
	e.st.Unlock()
}

// keptLookups is what a kept pool's record carries of the lookups.
func keptLookups(as []lookup.Answer) []restart.Lookup {
	out := make([]restart.Lookup, len(as))
	for i, a := range as {
		out[i] = restart.Lookup{RequestID: a.RequestID, HitChunks: a.HitChunks, Created: a.Created}
	}
	return out
}

// restartBound ends the gap once the wire server over an adopted plane is
// bound: the previous process stopped reading at a.stoppedAt.
func (e *Engine) restartBound(p *dataPlane) {
	a := p.adoption
	if a == nil || a.bound {
		return
	}
	a.bound = true
	gap := max(e.opts.Now().Sub(a.stoppedAt), 0)
	e.st.Lock()
	e.restart.Gap = gap
	r := e.restart
	e.st.Unlock()
	if a.cold {
		e.events.add(EventLifecycle, slog.LevelInfo, fmt.Sprintf(
			"restart: cold pool; %d contexts restored, %d refused; gap %d ms", r.Contexts, len(r.Refused), gap.Milliseconds()))
		return
	}
	e.events.add(EventLifecycle, slog.LevelInfo, fmt.Sprintf(
		"restart: adopted %d objects (%s), %d contexts and %d answered lookups, %d held for the previous process's workers; gap %d ms",
		r.Objects, settings.BytesText(r.Bytes), r.Contexts, r.Lookups, r.Held, gap.Milliseconds()))
}

func (e *Engine) setRestart(r Restart) {
	e.st.Lock()
	e.restart = r
	e.st.Unlock()
}

// keeper returns what the plane's release does instead of closing the
// pool when the stop keeps it: record the table, the registrations and the
// stop time in the state directory, and keep the segment.
func (e *Engine) keeper(cfg settings.Config, stoppedAt time.Time) func(p *dataPlane, kept keptState) error {
	e.st.RLock()
	gen, started := e.restart.Generation, e.started
	e.st.RUnlock()
	return func(p *dataPlane, kept keptState) error {
		regs, lookups := kept.regs, kept.lookups
		dir, file, err := e.stateFile(cfg)
		if err != nil {
			return errors.Join(err, p.pool.Close())
		}
		var objects int
		recorded := false
		rec := restart.Record{Build: e.opts.Version, Generation: gen, PID: e.opts.PID,
			Endpoint: endpointOf(cfg), StoppedAt: stoppedAt, Auto: cfg.Server.ShmName == nil, Registrations: regs}
		// The KV event description (tens of MiB for a large pool) is
		// written beside the record, on another core, streamed into its
		// file: both are in the restart's gap.
		var kv keptKV
		var kvDone chan struct{}
		if p.kv != nil {
			kvDone = make(chan struct{})
			go func() {
				defer close(kvDone)
				kv = e.describeKV(p.kv, dir, file, stoppedAt.UnixNano(), kept.tierHeld)
			}()
		}
		err = p.pool.Keep(func(k l1.Kept) error {
			objects = len(k.Objects)
			r := rec
			r.WrittenAt, r.Pool, r.Lookups = e.opts.Now(), k, lookups
			r.Transfers, r.CarryKey, r.Stats = kept.transfers, kept.carryKey, e.statsRecord(p, started)
			r.Handover = p.handover
			err := restart.Write(dir, file, r)
			recorded = err == nil
			return err
		})
		if kvDone != nil {
			<-kvDone
			e.placeKV(kv, recorded)
		}
		if err != nil && !recorded {
			// The pool is gone (private memory cannot be kept); the
			// registrations need no segment and are carried alone.
			rec.WrittenAt = e.opts.Now()
			if werr := restart.Write(dir, file, rec); werr != nil {
				err = errors.Join(err, fmt.Errorf("registrations not carried either: %w", werr))
			} else {
				e.log.Info("stop: registrations kept for the next start, without the pool", "registrations", len(regs), "record", dir+"/"+file)
			}
		}
		if err != nil {
			e.events.add(EventError, slog.LevelWarn, "stop: pool not kept: "+err.Error())
			return fmt.Errorf("keep pool: %w", err)
		}
		e.log.Info("stop: pool kept for the next start", "objects", objects, "registrations", len(regs), "lookups", len(lookups),
			"transfers", len(kept.transfers), "record", dir+"/"+file)
		e.events.add(EventLifecycle, slog.LevelInfo, fmt.Sprintf("stop: pool kept for the next start (%d objects, %d contexts)", objects, len(regs)))
		return nil
	}
}

// tellIgnored says in the log and the events what of the record was left
// out (its other parts were used) and which prompt links Adopt dropped.
func (e *Engine) tellIgnored(ignored []string, ad l1.Adopted) {
	if ad.LinksDropped > 0 {
		ignored = append(ignored, fmt.Sprintf("%d prompt link(s) dropped, first: %s", ad.LinksDropped, ad.LinkDropReason))
	}
	for _, why := range ignored {
		e.log.Warn("restart: part of the record left out", "reason", why)
		e.events.add(EventLifecycle, slog.LevelWarn, "restart: "+why)
	}
}
