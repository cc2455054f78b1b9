package lookup

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"kvdock/core/keys"
)

// Answer is a LOOKUP whose outcome waits for its QUERY_PREFETCH_STATUS.
// A restart hands the answers to the next process, so a query that reaches
// the new process gets the hits the old one found; their read locks travel
// with the kept pool.
type Answer struct {
	RequestID string
	HitChunks int
	Created   time.Time
}

// Answers lists the jobs whose tier phase has ended and that still wait
// for their query, oldest first. A job still in its tier phase is left out:
// its outcome is not known (the next process answers its query 0, as for an
// unknown request).
func (m *Module) Answers() []Answer {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked(now)
	out := make([]Answer, 0, len(m.jobs))
	for e := m.order.Front(); e != nil; e = e.Next() {
		if j := e.Value.(*job); !j.running {
			out = append(out, Answer{RequestID: j.id, HitChunks: j.hitChunks, Created: j.created})
		}
	}
	return out
}

// Restore takes the answers of a previous process (Answers, oldest first)
// as finished jobs, before this process answers any LOOKUP: each keeps its
// age (JobTTL counts from Created), the table's bounds hold (the oldest go
// first), and an id this process already has, or an earlier answer gave,
// keeps its own job. An answer with an invalid id, negative hits or a time
// not before now is refused with the reason; the others are restored. It
// returns how many were added (the bounds may push the oldest out again).
// The answers are sorted by age and merged into the table in one pass, so
// a restore costs O(n log n) in whatever order they come.
func (m *Module) Restore(as []Answer) (int, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var bad []string
	add := make([]*job, 0, len(as))
	for i, a := range as {
		switch err := keys.ValidateRequestID(a.RequestID); {
		case err != nil:
			bad = append(bad, fmt.Sprintf("answer %d: %v", i, err))
			continue
		case a.HitChunks < 0:
			bad = append(bad, fmt.Sprintf("answer %d: %d hit chunks", i, a.HitChunks))
			continue
		case a.Created.IsZero() || a.Created.After(now):
			bad = append(bad, fmt.Sprintf("answer %d: created %v, not before now", i, a.Created))
			continue
		case now.Sub(a.Created) >= m.ttl:
			continue // it would expire at once
		}
		if _, ok := m.jobs[a.RequestID]; ok {
			continue
		}
		j := &job{id: strings.Clone(a.RequestID), created: a.Created, hitChunks: a.HitChunks, cost: int64(jobOverhead + len(a.RequestID))}
		m.jobs[j.id] = j
		m.bytes += j.cost
		add = append(add, j)
	}
	// Oldest first: each behind the last job created no later than it.
	slices.SortStableFunc(add, func(x, y *job) int { return x.created.Compare(y.created) })
	at := m.order.Front()
	for _, j := range add {
		for at != nil && !at.Value.(*job).created.After(j.created) {
			at = at.Next()
		}
		if at == nil {
			j.elem = m.order.PushBack(j)
		} else {
			j.elem = m.order.InsertBefore(j, at)
		}
	}
	for len(m.jobs) > m.maxJobs || m.bytes > m.maxBytes {
		m.removeLocked(m.order.Front().Value.(*job))
		m.evicted.Add(1)
	}
	if len(bad) > 0 {
		if len(bad) > 4 {
			bad = append(bad[:4], fmt.Sprintf("and %d more", len(bad)-4))
		}
		return len(add), fmt.Errorf("lookup: restore: %s", strings.Join(bad, "; "))
	}
	return len(add), nil
}

// Busy reports lookups in their tier phase: a handover stop waits for
// them (bounded), so that their answers are carried rather than lost.
func (m *Module) Busy() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, j := range m.jobs {
		if j.running {
			return true
		}
	}
	return false
}
