package nongpu

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"kvdock/core/layout"
	"kvdock/core/restart"
	"kvdock/core/workers"
)

// Registrations lists the registered instances for a restart record, by
// id: what each registered with, its strategy and its protocol table.
func (m *Module) Registrations() []restart.Registration {
	m.mu.Lock()
	out := make([]restart.Registration, 0, len(m.instances))
	for _, inst := range m.instances {
		p := inst.p
		p.GroupLayouts = append(p.GroupLayouts[:0:0], p.GroupLayouts...)
		out = append(out, restart.Registration{ID: inst.id, Profile: inst.profile, Mode: string(inst.mode),
			Registered: inst.registered, Payload: p})
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Restore registers the instances of a restart record again, so that their
// workers, which never register twice, are served by the new process. Each
// is checked as a REGISTER is (the payload in full, the layout against the
// model's, server.max_instances) and refused alone with its reason.
//
// A PICKLE registration needs no segment and is always restored. An SHM
// one is restored only when segmentKept says this start adopted the
// segment its worker mapped, and the pool is shared: a worker never gets
// slots of a segment it does not map. Refused, its worker's requests are
// answered as for an unregistered instance (no slots, commits false,
// retrieves a miss) until it registers again.
//
// A restored instance has no ZMQ peer yet (its worker reconnects under a
// new routing id) and counts as held by a live one for the peer window:
// the first peer that speaks for it holds it, and an UNREGISTER from any
// peer before that is refused (UnregisterFrom). Its silence is counted
// from now; it is served under the protocol table it registered through.
func (m *Module) Restore(regs []restart.Registration, segmentKept bool) (restored int, refused []string) {
	now := m.now()
	for _, g := range regs {
		groups, err := m.validate(g.Payload)
		if err == nil && g.Payload.InstanceID != g.ID {
			err = fmt.Errorf("payload names instance %d", g.Payload.InstanceID)
		}
		mode, reason := workers.ModePickle, m.info.Reason
		if m.info.Shared() {
			reason = "the worker fell back to pickle before a restart"
		}
		if err == nil && workers.Mode(g.Mode) == workers.ModeSHM {
			switch {
			case !segmentKept:
				err = errors.New("registered for SHM on the previous pool's segment, which this start did not adopt: its worker maps that segment, not this one")
			case !m.info.Shared():
				err = fmt.Errorf("registered for SHM, and the pool is not shared (%s)", m.info.Reason)
			}
			mode, reason = workers.ModeSHM, "shared segment "+m.info.ShmName
		}
		if err == nil {
			err = m.restoreOne(g, groups, mode, reason, now)
		}
		if err != nil {
			refused = append(refused, fmt.Sprintf("instance %d: %v", g.ID, err))
			continue
		}
		restored++
	}
	if restored > 0 || len(refused) > 0 {
		m.event(workers.EventRegister, slog.LevelInfo, 0, fmt.Sprintf(
			"restart: %d registration(s) restored, %d refused", restored, len(refused)))
	}
	return restored, refused
}

// restoreOne adds one validated registration.
func (m *Module) restoreOne(g restart.Registration, groups []layout.Layout, mode workers.Mode, reason string, now time.Time) error {
	p := g.Payload
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if _, ok := m.instances[g.ID]; ok {
		return fmt.Errorf("already registered")
	}
	if err := m.roomLocked(g.ID); err != nil {
		return err
	}
	id, err := m.layouts.AddGroups(p.ModelName, p.WorldSize, groups)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrLayoutConflict, groupsText(groups), err)
	}
	registered := g.Registered
	if registered.IsZero() || registered.After(now) {
		registered = now
	}
	m.putLocked(&instance{id: g.ID, p: p, lay: groups[0], groups: groups, mode: mode, reason: reason,
		registered: registered, last: now, peerSeen: now, profile: g.Profile, restored: true, layoutID: id,
		// It served before the restart: its worker maps the segment if SHM.
		shmProven: true})
	return nil
}
