package misses

// Reset forgets every count, so the tally starts again from now.
func (t *Tally) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total, t.other = ContextCounts{}, ContextCounts{}
	clear(t.byCtx)
}
