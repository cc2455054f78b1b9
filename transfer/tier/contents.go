package tier

import (
	"kvdock/core/keys"
)

// named is a backend key this Set writes or a tier holds, for
// Options.Contents: the object it stores, whether the tier said it holds
// it, and the writes of it under way.
type named struct {
	key     keys.ObjectKey
	present bool
	writing int
}

// writing notes a write of k under name to m starting, so that the tier's
// word that it holds name can be told as k's.
func (m *member) writing(name string, k keys.ObjectKey) {
	if m.names == nil {
		return
	}
	m.nmu.Lock()
	defer m.nmu.Unlock()
	e := m.names[name]
	if e == nil {
		e = &named{key: k}
		m.names[name] = e
	}
	e.writing++
}

// written notes that write's end: a name the tier does not hold and no
// write is under way for is forgotten.
func (m *member) written(name string) {
	if m.names == nil {
		return
	}
	m.nmu.Lock()
	defer m.nmu.Unlock()
	if e := m.names[name]; e != nil {
		if e.writing--; e.writing == 0 && !e.present {
			delete(m.names, name)
		}
	}
}

// told passes on tier i's word that it holds name (present) or no longer
// does, once per change, for names this Set wrote; other names (an earlier
// run's values) are not told. It runs under the backend's lock, which
// orders the calls.
func (s *Set) told(i int, m *member, name string, present bool) {
	m.nmu.Lock()
	e := m.names[name]
	if e == nil || e.present == present {
		m.nmu.Unlock()
		return
	}
	e.present = present
	k := e.key
	if !present && e.writing == 0 {
		delete(m.names, name)
	}
	m.nmu.Unlock()
	s.opts.Contents(i, k, present)
}

// Held lists, per tier, the objects the tiers told they hold now
// (Options.Contents), for a restart that keeps the pool to carry them to
// the next process, which adopts them (Adopt). Bounded by the tiers' own
// values.
func (s *Set) Held() [][]keys.ObjectKey {
	out := make([][]keys.ObjectKey, len(s.tiers))
	for i, m := range s.tiers {
		if m.names == nil {
			continue
		}
		m.nmu.Lock()
		for _, e := range m.names {
			if e.present {
				out[i] = append(out[i], e.key)
			}
		}
		m.nmu.Unlock()
	}
	return out
}

// Adopt takes on, for Options.Contents, the objects ks an earlier process
// held in tier i (its Held, carried by a restart), told as this Set's own
// values from then on: each one whose layout is registered now (its name
// is the one a lookup asks the tier for, Key) and that the tier still
// holds is told present, now or once the tier finds it (Adopter), and its
// going later. A key that is no KV rank, a layout not registered, a name
// this Set knows already (written since) or a tier that cannot adopt
// changes nothing. It returns how many the tier took on.
func (s *Set) Adopt(i int, ks []keys.ObjectKey) int {
	if i < 0 || i >= len(s.tiers) {
		return 0
	}
	m := s.tiers[i]
	a, ok := m.b.(Adopter)
	if !ok || m.names == nil {
		return 0
	}
	took := 0
	for _, k := range ks {
		ws, w := int(k.KVRank>>24), int(k.KVRank>>16&0xff)
		if ws < 1 || w >= ws || k.KVRank != keys.KVRank(ws, w) {
			continue
		}
		lay, ok := s.layouts.LayoutOf(k.Model, ws, k.Layout, k.Group)
		if !ok {
			continue
		}
		name := Key(k, lay)
		m.nmu.Lock()
		if m.names[name] != nil {
			m.nmu.Unlock()
			continue
		}
		m.names[name] = &named{key: k}
		m.nmu.Unlock()
		// Not under nmu: the backend tells (told) under its own lock.
		if a.Adopt(name) {
			took++
			continue
		}
		m.nmu.Lock()
		if e := m.names[name]; e != nil && !e.present && e.writing == 0 {
			delete(m.names, name)
		}
		m.nmu.Unlock()
	}
	return took
}
