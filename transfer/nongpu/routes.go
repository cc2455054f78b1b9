package nongpu

import "sync"

// routes is what the wire server's protocol detection asks of the
// registrations (rpc.Instances, under --protocol auto): the table each
// registered instance registered through, and an instance each holder
// peer holds. It has a lock of its own, so the socket goroutine reads it
// without waiting for m.mu; it is written under m.mu, through putLocked,
// deleteLocked and holdLocked only. Its size follows the registrations
// (server.max_instances).
type routes struct {
	mu     sync.RWMutex
	tables map[int64]string
	held   map[string]int64
}

// InstanceTable is the protocol table instance id registered through
// (carried across a restart by its registration).
func (m *Module) InstanceTable(id int64) (string, bool) {
	m.routes.mu.RLock()
	defer m.routes.mu.RUnlock()
	p, ok := m.routes.tables[id]
	return p, ok
}

// PeerTable is the protocol table of a registered instance the ZMQ peer
// holds (see notePeerLocked for how a peer comes to hold one).
func (m *Module) PeerTable(peer []byte) (string, bool) {
	m.routes.mu.RLock()
	defer m.routes.mu.RUnlock()
	id, ok := m.routes.held[string(peer)]
	if !ok {
		return "", false
	}
	p, ok := m.routes.tables[id]
	return p, ok
}

// PeerDecided gives the table the wire server decided for peer to the
// instance peer registered while its table was a tie-break. Only the peer
// that registered it, while it still holds it, sets it, once: a peer that
// merely spoke for an instance never chooses its table (holdLocked).
func (m *Module) PeerDecided(peer []byte, profile string) {
	m.routes.mu.RLock()
	_, ok := m.routes.held[string(peer)]
	m.routes.mu.RUnlock()
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, inst := range m.instances {
		if inst.tentative && inst.peer == string(peer) {
			inst.profile, inst.tentative = profile, false
			m.routes.mu.Lock()
			m.routes.tables[inst.id] = profile
			m.routes.mu.Unlock()
		}
	}
}

// putLocked registers inst under its id, in place of the instance that
// had it; m.mu is held.
func (m *Module) putLocked(inst *instance) {
	old := m.instances[inst.id]
	m.instances[inst.id] = inst
	m.routes.mu.Lock()
	defer m.routes.mu.Unlock()
	if old != nil {
		m.unholdLocked(old.peer, old.id)
	}
	m.routes.tables[inst.id] = inst.profile
	if inst.peer != "" {
		m.routes.held[inst.peer] = inst.id
	}
}

// deleteLocked forgets inst; m.mu is held.
func (m *Module) deleteLocked(inst *instance) {
	delete(m.instances, inst.id)
	m.routes.mu.Lock()
	defer m.routes.mu.Unlock()
	delete(m.routes.tables, inst.id)
	m.unholdLocked(inst.peer, inst.id)
}

// holdLocked makes peer the holder of inst; m.mu is held. A table still
// tentative stays unknown: the new holder did not register it.
func (m *Module) holdLocked(inst *instance, peer string) {
	m.routes.mu.Lock()
	defer m.routes.mu.Unlock()
	m.unholdLocked(inst.peer, inst.id)
	inst.peer, inst.restored, inst.tentative = peer, false, false
	m.routes.held[peer] = inst.id
}

// unholdLocked drops peer's route through instance id, taking another
// instance peer holds, if any, in its place; m.mu and routes.mu are held.
func (m *Module) unholdLocked(peer string, id int64) {
	if peer == "" || m.routes.held[peer] != id {
		return
	}
	delete(m.routes.held, peer)
	for _, other := range m.instances {
		if other.id != id && other.peer == peer {
			m.routes.held[peer] = other.id
			return
		}
	}
}
