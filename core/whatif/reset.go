package whatif

// ResetCounts forgets the accesses the curve rests on, so that it shows
// the traffic from now on. What the sample stack and the simulated pools
// hold stays: it is the cache's content, which a reset of the statistics
// does not change, and without it the next reuses would look like misses.
func (e *Estimator) ResetCounts() {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fold() // probes so far are folded, then dropped with the rest
	e.hits, e.simHits = [nf]float64{}, [nf]float64{}
	e.weight, e.realHits, e.expected, e.expHits = 0, 0, 0, 0
	e.lookups = 0
}
