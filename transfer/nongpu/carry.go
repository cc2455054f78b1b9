package nongpu

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"log/slog"
	"time"

	"kvdock/core/l1"
	"kvdock/core/protocol"
	"kvdock/core/restart"
	"kvdock/core/workers"
)

// Transfers carried across a restart. A stop that hands over answers its
// workers' last requests (rpc.Handover); a PREPARE_STORE or
// PREPARE_RETRIEVE answered then is committed by the worker to the next
// process. The pending maps key an entry by a hash seeded per process, so
// from the moment the stop starts carrying every new entry also gets a
// key the successor can compute: the same fields, the tokens and the salt
// hashed with a secret (HMAC-SHA-256) that the restart record carries. The
// successor puts the carried entries back in its pending maps under those
// keys (pendingKey.carried), so every drop path (unregister, reap, id
// reuse, removal, close, expiry) ends them as it ends its own; a commit
// that finds no entry of its own looks for a carried one.

// busyAge is how recent a pending transfer must be for a handover to wait
// for its commit (older ones belong to workers that went away).
const busyAge = time.Second

// Busy reports a transfer prepared less than busyAge ago whose commit has
// not come: a handover waits for it before it parks its workers.
func (m *Module) Busy() bool {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, table := range []map[pendingKey]*pending{m.writes, m.reads} {
		for _, p := range table {
			if now.Sub(p.created) < busyAge {
				return true
			}
		}
	}
	return false
}

// StartCarrying makes every transfer prepared from now on carryable (a
// handover's answer phase).
func (m *Module) StartCarrying() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.carryKey == nil {
		key := make([]byte, restart.CarryKeyBytes)
		if _, err := rand.Read(key); err != nil {
			return fmt.Errorf("nongpu: carry key: %w", err)
		}
		m.carryKey = key
	}
	m.carrying = true
	return nil
}

// carryKeyLocked is pk's carried key when the module carries; m.mu is held.
func (m *Module) carryKeyLocked(pk pendingKey, k protocol.Key) *pendingKey {
	if !m.carrying || m.carryKey == nil {
		return nil
	}
	ck := m.digestKey(pk, k)
	return &ck
}

// digestKey is pk with its tokens and salt hashed with the carry key.
func (m *Module) digestKey(pk pendingKey, k protocol.Key) pendingKey {
	h := hmac.New(sha256.New, m.carryKey)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(len(k.TokenIDs)))
	h.Write(b[:])
	buf := make([]byte, 0, 4096)
	for _, t := range k.TokenIDs {
		buf = binary.LittleEndian.AppendUint32(buf, t)
		if len(buf) == cap(buf) {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	h.Write(buf)
	binary.LittleEndian.PutUint64(b[:], uint64(len(k.CacheSalt)))
	h.Write(b[:])
	h.Write([]byte(k.CacheSalt))
	sum := h.Sum(nil)
	pk.tokens = binary.LittleEndian.Uint64(sum[0:8])
	pk.salt = binary.LittleEndian.Uint64(sum[8:16])
	pk.carried = true
	return pk
}

// hasCarried reports that this process restored carried transfers: a
// commit that finds no entry of its own then looks for a carried one (the
// keyed hash is paid on such misses only).
func (m *Module) hasCarried() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.restoredCarry
}

// carriedKey is the carried form of pk (the request's key k).
func (m *Module) carriedKey(pk pendingKey, k protocol.Key) pendingKey {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.carryKey == nil {
		return pk
	}
	return m.digestKey(pk, k)
}

// takeCarriedWrite takes the carried pending write of the commit pk, k.
func (m *Module) takeCarriedWrite(pk pendingKey, k protocol.Key) *pending {
	if !m.hasCarried() {
		return nil
	}
	return m.takePending(m.writes, m.carriedKey(pk, k))
}

// Carry takes out of the pending maps the transfers a restart record
// carries (those with a carry key, and those carried here already), so that
// Close does not abandon them: their reservations stay live and their read
// holds in force in the kept pool. Expired ones stay, for Close.
func (m *Module) Carry() ([]restart.Transfer, []byte) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.carryKey == nil {
		return nil, nil
	}
	var out []restart.Transfer
	for _, write := range []bool{true, false} {
		table, ttl := m.reads, m.readTTL
		if write {
			table, ttl = m.writes, m.writeTTL
		}
		for pk, p := range table {
			ck := p.carry
			if pk.carried {
				ck = &pk
			}
			if ck == nil || now.Sub(p.created) >= ttl/2 || len(out) >= restart.MaxTransfers {
				continue
			}
			t := restart.Transfer{Instance: ck.instance, Write: write, WorldSize: ck.worldSize, Worker: ck.worker,
				NTokens: ck.nTokens, Start: ck.start, End: ck.end, NSalt: ck.nSalt, Created: p.created, Readers: p.readers}
			binary.LittleEndian.PutUint64(t.Digest[0:8], ck.tokens)
			binary.LittleEndian.PutUint64(t.Digest[8:16], ck.salt)
			for _, r := range p.res {
				t.Offsets = append(t.Offsets, r.Offset)
			}
			for _, r := range p.refs {
				t.Offsets = append(t.Offsets, r.Offset)
			}
			if len(t.Offsets) == 0 {
				continue
			}
			out = append(out, t)
			delete(table, pk)
		}
	}
	return out, m.carryKey
}

// RestoreCarried puts the transfers of a restart record back in the
// pending maps, for their workers' commits: each needs its instance
// registered (Restore first) and the pool to hand over the reservations or
// read holds at its offsets; one that does not fit is left out alone, its
// holds ended by their deadlines. The key is the record's carry key.
func (m *Module) RestoreCarried(ts []restart.Transfer, key []byte) (restored int, refused []string) {
	if len(ts) == 0 || len(key) != restart.CarryKeyBytes {
		return 0, nil
	}
	now := m.now()
	m.mu.Lock()
	m.carryKey = append([]byte(nil), key...)
	m.mu.Unlock()
	for i, t := range ts {
		if err := m.restoreTransfer(t, now); err != nil {
			refused = append(refused, fmt.Sprintf("transfer %d of instance %d: %v", i, t.Instance, err))
			continue
		}
		restored++
	}
	if restored > 0 || len(refused) > 0 {
		m.event(workers.EventRegister, slog.LevelInfo, 0, fmt.Sprintf(
			"restart: %d transfer(s) prepared by the previous process restored for their commits, %d refused", restored, len(refused)))
	}
	return restored, refused
}

func (m *Module) restoreTransfer(t restart.Transfer, now time.Time) error {
	m.mu.Lock()
	inst := m.instances[t.Instance]
	closed := m.closed
	m.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case inst == nil:
		return ErrNotRegistered
	case inst.p.WorldSize != t.WorldSize:
		return fmt.Errorf("world size %d, the instance has %d", t.WorldSize, inst.p.WorldSize)
	}
	pk := pendingKey{instance: t.Instance, worldSize: t.WorldSize, worker: t.Worker, nTokens: t.NTokens,
		tokens: binary.LittleEndian.Uint64(t.Digest[0:8]), start: t.Start, end: t.End, nSalt: t.NSalt,
		salt: binary.LittleEndian.Uint64(t.Digest[8:16]), carried: true}
	created := t.Created
	if created.After(now) {
		created = now
	}
	p := &pending{inst: inst, created: created, readers: t.Readers}
	if t.Write {
		res, ok := m.pool.ClaimWrites(l1.InstanceOwner(t.Instance), t.Offsets)
		if !ok {
			return fmt.Errorf("its %d reservations are not in the adopted pool", len(t.Offsets))
		}
		p.res, p.bytes = res, reservedBytes(res)
	} else {
		refs, ok := m.pool.ClaimHolds(t.Offsets)
		if !ok {
			return fmt.Errorf("its %d read holds are not in the adopted pool", len(t.Offsets))
		}
		p.refs = refs
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	table := m.reads
	if t.Write {
		table = m.writes
	}
	if m.closed || m.instances[t.Instance] != inst {
		m.mu.Unlock()
		m.discard(onlyIf(t.Write, p), onlyIf(!t.Write, p))
		m.mu.Lock()
		return ErrNotRegistered
	}
	if table[pk] != nil {
		m.mu.Unlock()
		m.discard(onlyIf(t.Write, p), onlyIf(!t.Write, p))
		m.mu.Lock()
		return fmt.Errorf("recorded twice")
	}
	table[pk] = p
	m.restoredCarry = true
	return nil
}

// onlyIf is []*pending{p} when ok, else none.
func onlyIf(ok bool, p *pending) []*pending {
	if ok {
		return []*pending{p}
	}
	return nil
}
