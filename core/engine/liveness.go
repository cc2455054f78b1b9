package engine

import (
	"errors"
	"fmt"
	"time"

	"kvdock/core/protocol"
	"kvdock/settings"
	"kvdock/transfer/nongpu"
)

// livenessFor is the transfer module's liveness settings for cfg served
// under profile: the reaper runs only when the profile's PING carries the
// instance id (seed-era workers cannot prove they are alive).
func livenessFor(cfg settings.Config, profile *protocol.Profile, detect []*protocol.Profile) nongpu.Liveness {
	secs := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
	l := nongpu.Liveness{
		Reap:    profile != nil && profile.PingCarriesID(),
		Timeout: secs(cfg.Server.WorkerReapTimeoutSeconds),
		Grace:   secs(cfg.Server.WorkerRegistrationGraceSeconds),
		Idle:    secs(cfg.Server.WorkerIdleSeconds),
	}
	if detect != nil {
		// One table per peer: the reaper runs when any table's PING
		// carries the id, and takes only instances registered through one.
		l.Reap, l.Profiles = false, []string{}
		for _, p := range detect {
			if p.PingCarriesID() {
				l.Reap = true
				l.Profiles = append(l.Profiles, p.Name)
			}
		}
	}
	return l
}

// RemoveInstance drops a registered worker instance on the operator's word
// (dashboard, kvdock ctl unregister, the HTTP API), as an unregister would:
// its pending writes are never published, its pending transfers abandoned
// to their TTL (the worker may still be copying). It reports
// ErrUnknownInstance for an id nobody registered, which changes nothing.
func (e *Engine) RemoveInstance(id int64, by ClearOrigin) error {
	p := e.cur.Load().dataPlane
	if p == nil || !p.gate.enter() {
		return errNotRunning
	}
	defer p.gate.exit()
	if !p.transfer.Remove(id, string(by)) {
		return fmt.Errorf("instance %d is not registered: %w", id, ErrUnknownInstance)
	}
	return nil
}

// ErrUnknownInstance answers a removal of an id nobody registered.
var ErrUnknownInstance = errors.New("unknown instance")
