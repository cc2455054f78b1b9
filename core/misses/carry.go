package misses

// Carry adds the counts of r (a predecessor's tally, handed over by a
// restart that adopted its pool) to t, its contexts within MaxContexts as
// Add keeps them.
func (t *Tally) Carry(r Report) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total.Missed.Add(&r.Total)
	t.total.TierMissed += r.TierMissed
	t.other.Missed.Add(&r.Other.Missed)
	t.other.TierMissed += r.Other.TierMissed
	for _, c := range r.Contexts {
		e, ok := t.byCtx[c.Context]
		if !ok {
			if len(t.byCtx) >= MaxContexts {
				e = &t.other
			} else {
				e = &ContextCounts{Context: c.Context}
				t.byCtx[c.Context] = e
			}
		}
		e.Missed.Add(&c.Missed)
		e.TierMissed += c.TierMissed
	}
}
