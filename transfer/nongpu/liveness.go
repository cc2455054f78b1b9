package nongpu

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"kvdock/core/layout"
	"kvdock/core/workers"
)

// Liveness is how the module judges instances that went silent (live
// settings). It follows upstream's worker liveness design
// (docs/design/worker_liveness.md of LMCache): an instance is reaped after
// Timeout of silence once it has both pinged with its id and transferred,
// after Grace otherwise; the reaper scans every Timeout/4.
type Liveness struct {
	// Reap enables the reaper. The engine sets it only for profiles whose
	// PING carries the instance id: seed-era workers ping without it, so
	// an idle seed worker cannot prove it is alive and is never reaped.
	Reap bool
	// Timeout is the silence after which a pinged and transferring instance
	// is reaped (--worker-reap-timeout-seconds); 0 disables reaping.
	Timeout time.Duration
	// Grace is the silence after which any other instance is reaped
	// (--worker-registration-grace-seconds).
	Grace time.Duration
	// Idle is the silence after which an instance shows as idle; 0 never.
	Idle time.Duration
	// Profiles, when set (--protocol auto, one table per peer), names the
	// profiles whose PING carries the instance id: only instances that
	// registered through one of them are reaped, so a seed-era worker
	// served beside engine-driven ones is never reaped either.
	Profiles []string
}

// Summary is l as the faces show it.
func (l Liveness) Summary() workers.Liveness {
	return workers.Liveness{Reaping: l.Reaping(), Timeout: l.Timeout, Grace: l.Grace, Idle: l.Idle}
}

// Reaping reports whether the reaper runs.
func (l Liveness) Reaping() bool { return l.Reap && l.Timeout > 0 }

// ScanInterval is how often the reaper scans: a quarter of the timeout, as
// upstream, so a dead instance goes within Timeout + Timeout/4.
func (l Liveness) ScanInterval() time.Duration {
	if d := l.Timeout / 4; d > 0 {
		return d
	}
	return time.Second
}

// maxGone bounds how many reaped or removed instances are remembered for
// the operator (the oldest are forgotten first).
const maxGone = 32

// SetLiveness changes the liveness settings (live).
func (m *Module) SetLiveness(l Liveness) {
	m.mu.Lock()
	m.liveness = l
	m.mu.Unlock()
	select {
	case m.livenessChanged <- struct{}{}:
	default:
	}
}

// LivenessSettings returns the settings in force.
func (m *Module) LivenessSettings() Liveness {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.liveness
}

// Touch handles a PING carrying an instance id: a registered instance is
// marked alive (and as pinging); an unknown id changes nothing, so a flood
// of made-up ids keeps no state. It reports whether the id is registered.
func (m *Module) Touch(id int64, peer []byte) bool {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	inst, ok := m.instances[id]
	if !ok || m.closed {
		return false
	}
	inst.last = now
	inst.pinged = true
	m.notePeerLocked(inst, peer, now)
	return true
}

// begin notes a request naming instance id from peer: its time, the peer,
// and one more request in flight until the returned func is called. An
// unknown id is not tracked.
func (m *Module) begin(id int64, peer []byte) func() {
	now := m.now()
	m.mu.Lock()
	inst, ok := m.instances[id]
	if !ok || m.closed {
		m.mu.Unlock()
		return func() {}
	}
	inst.last = now
	inst.inFlight++
	m.notePeerLocked(inst, peer, now)
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		inst.inFlight--
		m.mu.Unlock()
	}
}

// DefaultPeerWindow is how long the peer holding an instance counts as
// alive after it last spoke for it when the reap timeout is not set.
const DefaultPeerWindow = 120 * time.Second

// peerWindowLocked is how long the holder of an instance counts as alive
// after it last spoke for it: the reap timeout (a pinging worker speaks
// well within it), else DefaultPeerWindow. m.mu is held.
func (m *Module) peerWindowLocked() time.Duration {
	if m.liveness.Timeout > 0 {
		return m.liveness.Timeout
	}
	return DefaultPeerWindow
}

// peerAliveLocked reports whether the peer holding inst spoke for it within
// the peer window; m.mu is held.
func (m *Module) peerAliveLocked(inst *instance, now time.Time) bool {
	return now.Sub(inst.peerSeen) < m.peerWindowLocked()
}

// notePeerLocked records that peer spoke for inst at now; m.mu is held. The
// holder stays until it has been silent for the peer window; then the next
// peer that speaks for the instance holds it (a worker whose connection
// came back under a new routing id). Another peer naming the instance
// meanwhile takes nothing, so it cannot make an UNREGISTER its own. A
// registration a restart restored has no holder (its worker reconnects
// under a new routing id): the first peer that speaks for it takes it, as
// after the window. The routing id is at most 255 bytes (ZMQ's limit), so
// keeping it is bounded.
func (m *Module) notePeerLocked(inst *instance, peer []byte, now time.Time) {
	if len(peer) == 0 {
		return
	}
	if inst.peer != string(peer) {
		if inst.peer != "" && m.peerAliveLocked(inst, now) {
			return
		}
		m.holdLocked(inst, string(peer))
	}
	inst.peerSeen = now
}

// peerText renders a routing id for logs and the operator.
func peerText(peer string) string {
	if peer == "" {
		return "unknown peer"
	}
	return "peer " + peerHex(peer)
}

// maxPeerShown is how much of a ZMQ routing id is shown: libzmq's own ids
// are 5 bytes, a peer may choose up to 255, and /status lists up to
// --max-instances of them.
const maxPeerShown = 16

// peerHex is peer in hex, its first maxPeerShown bytes and "…" when longer.
func peerHex(peer string) string {
	if len(peer) > maxPeerShown {
		return hex.EncodeToString([]byte(peer[:maxPeerShown])) + "…"
	}
	return hex.EncodeToString([]byte(peer))
}

// staleLocked says why inst is due for reaping at now ("" when it is not);
// m.mu is held.
func (m *Module) staleLocked(inst *instance, now time.Time) string {
	if inst.inFlight > 0 {
		return "" // a request of it is being served: it spoke just now
	}
	if l := m.liveness.Profiles; l != nil && !slices.Contains(l, inst.profile) {
		return "" // its table's PING has no id: it cannot prove it is alive
	}
	silent := now.Sub(inst.last)
	l := m.liveness
	if inst.pinged && inst.transferred {
		if silent >= l.Timeout {
			return fmt.Sprintf("silent for %s (reap timeout %s)", silent.Round(time.Second), l.Timeout)
		}
		return ""
	}
	if silent >= l.Grace {
		return fmt.Sprintf("silent for %s (registration grace %s; pinged %t, transferred %t)",
			silent.Round(time.Second), l.Grace, inst.pinged, inst.transferred)
	}
	return ""
}

// Reap runs one reaper scan: every instance due is dropped as an
// unregister drops it (pending writes never published; pending
// transfers abandoned to their TTL), with an event, and counted. It returns the reaped ids.
// Nothing happens unless the reaper is enabled.
func (m *Module) Reap() []int64 {
	now := m.now()
	type reaped struct {
		inst         *instance
		why          string
		writes, read []*pending
	}
	var out []reaped
	m.mu.Lock()
	if m.closed || !m.liveness.Reaping() {
		m.mu.Unlock()
		return nil
	}
	for id, inst := range m.instances {
		why := m.staleLocked(inst, now)
		if why == "" {
			continue
		}
		w, r := m.dropLocked(id, inst, workers.StateReaped, now)
		m.stats.Reaped++
		out = append(out, reaped{inst: inst, why: why, writes: w, read: r})
	}
	m.mu.Unlock()
	ids := make([]int64, 0, len(out))
	for _, r := range out {
		m.discard(r.writes, r.read)
		ids = append(ids, r.inst.id)
		m.event(workers.EventReaped, slog.LevelWarn, r.inst.id, fmt.Sprintf(
			"instance %d (%s, %s) reaped: %s; %d pending writes (never published) and %d pending reads abandoned to their TTL",
			r.inst.id, r.inst.p.ModelName, peerText(r.inst.peer), r.why, len(r.writes), len(r.read)))
	}
	return ids
}

// Remove drops a registered instance on the operator's word (dashboard,
// kvdock ctl unregister, HTTP): as an unregister, remembered as removed.
// by names who asked. It reports whether the id was registered; an unknown
// id changes nothing.
func (m *Module) Remove(id int64, by string) bool {
	now := m.now()
	m.mu.Lock()
	inst, ok := m.instances[id]
	if !ok || m.closed {
		m.mu.Unlock()
		return false
	}
	writes, reads := m.dropLocked(id, inst, workers.StateRemoved, now)
	m.stats.Removed++
	m.mu.Unlock()
	m.discard(writes, reads)
	m.event(workers.EventRemoved, slog.LevelInfo, id, fmt.Sprintf(
		"instance %d (%s, %s) removed by %s; %d pending writes (never published) and %d pending reads abandoned to their TTL",
		id, inst.p.ModelName, peerText(inst.peer), by, len(writes), len(reads)))
	return true
}

// dropLocked forgets a registered instance: its pending entries are taken
// (the caller discards them outside the lock), its layout reference dropped,
// and, for a reaped or removed one, a record kept for the operator. m.mu is
// held.
func (m *Module) dropLocked(id int64, inst *instance, state workers.State, now time.Time) (writes, reads []*pending) {
	m.deleteLocked(inst)
	writes, reads = m.takePendingLocked(func(k pendingKey) bool { return k.instance == id })
	m.layouts.Remove(inst.p.ModelName, inst.p.WorldSize, inst.layoutID)
	if state == workers.StateReaped || state == workers.StateRemoved {
		c := m.contextLocked(inst, now)
		c.State, c.Gone, c.InFlight = state, now, 0
		m.forgetGoneLocked(id)
		if len(m.gone) >= maxGone {
			m.gone = m.gone[1:]
		}
		m.gone = append(m.gone, c)
	}
	return writes, reads
}

// forgetGoneLocked drops the record of a departed id (it registered again).
func (m *Module) forgetGoneLocked(id int64) {
	for i, c := range m.gone {
		if c.InstanceID == id {
			m.gone = append(m.gone[:i:i], m.gone[i+1:]...)
			return
		}
	}
}

// contextLocked is inst as the faces see it at now; m.mu is held.
func (m *Module) contextLocked(inst *instance, now time.Time) workers.ContextInfo {
	state := workers.StateActive
	if idle := m.liveness.Idle; idle > 0 && inst.inFlight == 0 && now.Sub(inst.last) >= idle {
		state = workers.StateIdle
	}
	peer := ""
	if inst.peer != "" {
		peer = peerHex(inst.peer)
	}
	return workers.ContextInfo{
		InstanceID: inst.id, Model: inst.p.ModelName, WorldSize: inst.p.WorldSize,
		BlockSize: inst.p.BlockSize, NumLayers: inst.p.NumLayers, HiddenDimSize: inst.p.HiddenDimSize,
		Layout: layout.Layout{Shape: append([]int(nil), inst.lay.Shape...), Dtype: inst.lay.Dtype, Bytes: inst.lay.Bytes},
		Groups: cloneLayouts(inst.groups),
		MLA:    inst.p.UseMLA, Mode: inst.mode, Reason: inst.reason, Registered: inst.registered, LastRequest: inst.last,
		Peer: peer, InFlight: inst.inFlight, State: state, Pinged: inst.pinged, Transferred: inst.transferred,
		Stores: inst.stores, StoreFailures: inst.storeFailures, Retrieves: inst.retrieves,
		HitChunks: inst.hitChunks, BytesIn: inst.bytesIn, BytesOut: inst.bytesOut,
	}
}

// RunReaper scans for dead instances every Liveness.ScanInterval while the
// reaper is enabled, until ctx is done; a settings change takes effect at
// once.
func (m *Module) RunReaper(ctx context.Context) {
	for {
		l := m.LivenessSettings()
		var tick <-chan time.Time
		var t *time.Timer
		if l.Reaping() {
			t = time.NewTimer(l.ScanInterval())
			tick = t.C
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return
		case <-m.livenessChanged:
		case <-tick:
			m.Reap()
		}
		if t != nil {
			t.Stop()
		}
	}
}
