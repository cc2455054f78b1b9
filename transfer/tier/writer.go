package tier

import (
	"context"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
)

// Enqueue queues published L1 objects ks (each lay.Bytes bytes) for every
// tier under the write-behind policy. It never blocks: a tier whose queue
// is full in items or bytes drops the object and counts it. The bytes are
// copied out of L1 only when a worker takes the object, under a read hold.
func (s *Set) Enqueue(ks []keys.ObjectKey, lay layout.Layout) {
	if s.opts.StorePolicy != StoreWriteBehind || len(ks) == 0 || s.ctx.Err() != nil {
		return
	}
	for _, m := range s.tiers {
		for _, k := range ks {
			it := item{key: k, lay: lay, size: lay.Bytes}
			if m.st.qbytes.Add(it.size) > s.opts.QueueBytes {
				m.st.qbytes.Add(-it.size)
				m.st.dropped.Add(1)
				continue
			}
			select {
			case m.q <- it:
				m.st.queued.Add(1)
			default:
				m.st.qbytes.Add(-it.size)
				m.st.dropped.Add(1)
			}
		}
	}
}

// work writes m's queued objects until the Set stops.
func (s *Set) work(m *member) {
	for {
		select {
		case <-s.ctx.Done():
			return
		case it := <-m.q:
			s.write(m, it)
			m.st.queued.Add(-1)
			m.st.qbytes.Add(-it.size)
		}
	}
}

// write copies it out of L1 and puts it to m. The object is pinned (a read
// lock turned into a hold) for the copy, so neither eviction nor a clear
// can free or reuse its bytes meanwhile; an object no longer published is
// skipped, and nothing but the published object's bytes is ever written.
func (s *Set) write(m *member, it item) {
	name := Key(it.key, it.lay)
	v, ok := s.copyOut(it, name)
	if !ok {
		m.st.skipped.Add(1)
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.WriteTimeout)
	defer cancel()
	if err := m.b.Put(ctx, name, v); err != nil {
		m.st.failed.Add(1)
		s.log.Debug("tier write failed", "key", it.key, "err", err)
		return
	}
	m.st.written.Add(1)
}

// copyOut returns the tier value of it under name, copied from L1 under a
// hold, or false when the object is gone (evicted, cleared, not yet
// readable) or its size is not the layout's.
func (s *Set) copyOut(it item, name string) ([]byte, bool) {
	one := []keys.ObjectKey{it.key}
	if s.pool.ReserveReadPrefix(one, 1) != 1 {
		return nil, false
	}
	ref, ok := s.pool.HoldRead(it.key)
	if !ok {
		s.pool.FinishRead(one, 1)
		return nil, false
	}
	defer s.pool.ReleaseRead([]l1.ReadRef{ref})
	if ref.Length != it.size {
		return nil, false
	}
	if s.beforeCopy != nil {
		s.beforeCopy(it.key)
	}
	src, release := s.pool.View(ref.Offset, ref.Length)
	defer release()
	if src == nil {
		return nil, false
	}
	v, dst, err := newValue(name, it.lay, len(src))
	if err != nil {
		return nil, false
	}
	copy(dst, src)
	seal(v, len(v)-len(dst))
	return v, true
}
