package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"kvdock/core/l1"
	"kvdock/core/lookup"
	"kvdock/core/restart"
	"kvdock/settings"
)

// Restart is the last start's adoption of a kept pool, for the faces.
type Restart struct {
	// Adopted: the pool and registrations of the previous process were
	// adopted; otherwise Reason says why not ("" when there was no record).
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
}

// adoption is what a plane built over an adopted pool still has to do.
type adoption struct {
	regs      []restart.Registration
	lookups   []restart.Lookup
	stoppedAt time.Time
	bound     bool
}

// stateFile is the record's directory and file for cfg.
func (e *Engine) stateFile(cfg settings.Config) (dir, file string, err error) {
	dir, err = cfg.Server.StateDirPath(os.Getenv, os.UserHomeDir)
	return dir, restart.FileName(cfg.Server.Host, cfg.Server.Port), err
}

func endpointOf(cfg settings.Config) string {
	return net.JoinHostPort(cfg.Server.Host, strconv.Itoa(cfg.Server.Port))
}

// openPool opens the pool of cfg: it adopts the pool kept by the previous
// process when a record for this endpoint exists and matches the settings
// (segment name, private or auto, size, alignment) and the segment is the one
// recorded; otherwise it creates one, after removing a kept segment that
// will not be adopted. The record is consumed either way.
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
	if err != nil {
		reason = "restart record refused: " + err.Error()
	} else {
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
				e.setRestart(Restart{Adopted: true, Objects: ad.Objects, Bytes: ad.Bytes, Held: ad.Held,
					At: now, Generation: rec.Generation + 1})
				e.log.Info("restart: pool adopted", "segment", rec.Pool.Segment.Name, "objects", ad.Objects, "bytes", ad.Bytes,
					"held", ad.Held, "expired", ad.Expired, "generation", rec.Generation+1, "written_by", rec.Build)
				return pool, &adoption{regs: rec.Registrations, lookups: rec.Lookups, stoppedAt: rec.StoppedAt}, nil
			}
			reason = aerr.Error()
		}
		reason = "kept pool not adopted: " + reason
		if gone, _ := l1.RemoveKept(opts.ShmDir, rec.Pool.Segment); gone {
			reason += fmt.Sprintf(" (kept segment %s removed)", rec.Pool.Segment.Name)
		}
	}
	e.setRestart(Restart{Reason: reason, At: now})
	e.log.Warn("restart: cold start", "reason", reason)
	e.events.add(EventLifecycle, slog.LevelWarn, "restart: nothing adopted: "+reason)
	pool, err := l1.Open(opts)
	return pool, nil, err
}

// restoreRegistrations registers the adopted pool's workers again and
// restores the lookups the previous process answered and nobody queried.
func (e *Engine) restoreRegistrations(p *dataPlane, a *adoption) {
	if a == nil {
		return
	}
	n, refused := p.transfer.Restore(a.regs)
	for _, r := range refused {
		e.log.Warn("restart: registration not restored", "reason", r)
	}
	as := make([]lookup.Answer, len(a.lookups))
	for i, l := range a.lookups {
		as[i] = lookup.Answer{RequestID: l.RequestID, HitChunks: l.HitChunks, Created: l.Created}
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
func (e *Engine) keeper(cfg settings.Config, stoppedAt time.Time) func(p *dataPlane, regs []restart.Registration, lookups []restart.Lookup) error {
	e.st.RLock()
	gen := e.restart.Generation
	e.st.RUnlock()
	return func(p *dataPlane, regs []restart.Registration, lookups []restart.Lookup) error {
		dir, file, err := e.stateFile(cfg)
		if err != nil {
			return errors.Join(err, p.pool.Close())
		}
		var objects int
		err = p.pool.Keep(func(k l1.Kept) error {
			objects = len(k.Objects)
			return restart.Write(dir, file, restart.Record{Build: e.opts.Version, Generation: gen, PID: e.opts.PID,
				Endpoint: endpointOf(cfg), StoppedAt: stoppedAt, WrittenAt: e.opts.Now(), Auto: cfg.Server.ShmName == nil,
				Pool: k, Registrations: regs, Lookups: lookups})
		})
		if err != nil {
			e.events.add(EventError, slog.LevelWarn, "stop: pool not kept: "+err.Error())
			return fmt.Errorf("keep pool: %w", err)
		}
		e.log.Info("stop: pool kept for the next start", "objects", objects, "registrations", len(regs), "lookups", len(lookups), "record", dir+"/"+file)
		e.events.add(EventLifecycle, slog.LevelInfo, fmt.Sprintf("stop: pool kept for the next start (%d objects, %d contexts)", objects, len(regs)))
		return nil
	}
}
