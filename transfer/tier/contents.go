package tier

import "kvdock/core/keys"

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
